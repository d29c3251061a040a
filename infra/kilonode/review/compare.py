"""Two snapshots of one stack in, what changed out: the rendered files as unified diffs, and
each resource created, updated (which inputs), replaced or deleted, with what a changed input
does (kilonode/catalog/effects.toml: replace, restart, rollout, refused; with its source).

Pure: snapshots are the dictionaries kilonode.review.snapshot writes.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilonode.catalog.effects import Effect, effects

CREATE, UPDATE, REPLACE, DELETE = "create", "update", "replace", "delete"


def matches(effect: Effect, changed: str) -> bool:
    """A changed path at, under, or above (a whole parent replaced) this effect's path."""
    return covers(changed, (effect.path,)) or covers(effect.path, (_general(changed),))


# A list item's place in a path: its index, or its identity (`[name=allow-ssh]`, see flatten).
_ITEM = re.compile(r"\[(?:\d+|[A-Za-z]+=[^\[\]]*)\]")


def _general(path: str) -> str:
    """`a.b[3].c`, `a.b[name=x].c` -> `a.b[].c`: the form effects.toml, replaceOnChanges and
    ignoreChanges use."""
    return _ITEM.sub("[]", path)


def covers(path: str, prefixes: Iterable[str]) -> bool:
    """Is `path` (list indices generalised) one of `prefixes` or inside one of them."""
    general = _general(path)
    return any(general == p or general.startswith((p + ".", p + "[")) for p in prefixes)


def natural(text: str) -> list[Any]:
    """'x-10' after 'x-9': digits compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


@dataclass(frozen=True)
class FileChange:
    path: str
    status: str  # added | removed | modified
    diff: str  # unified diff, both sides' text

    @property
    def host(self) -> str:
        """The host role the file belongs to (etcd-main-0, pool-a100-ib, in-cluster), or '' for
        the stack-wide files (config.yaml, plan.yaml)."""
        return self.path.split("/", 1)[0] if "/" in self.path else ""


@dataclass(frozen=True)
class InputChange:
    path: str
    before: Any
    after: Any
    effects: tuple[Effect, ...] = ()
    ignored: bool = False  # under the resource's ignoreChanges: `pulumi up` leaves it alone


@dataclass(frozen=True)
class ResourceChange:
    type: str
    name: str
    action: str  # create | update | replace | delete
    role: str | None
    inputs: tuple[InputChange, ...] = ()
    protect: tuple[bool, bool] = (False, False)  # before, after
    base: Mapping[str, Any] | None = None  # the recorded resource on each side
    head: Mapping[str, Any] | None = None

    @property
    def kinds(self) -> set[str]:
        """The effects its applied input changes have (replace, restart, rollout, refused)."""
        return {e.effect for c in self.inputs if not c.ignored for e in c.effects}

    @property
    def restarts(self) -> bool:
        """Would this change take the machine down: replaced, deleted, or restarted in place."""
        return self.action in (REPLACE, DELETE) or "restart" in self.kinds

    def reason(self) -> str:
        """Why it is replaced or restarted, in a few words."""
        paths = [c.path for c in self.inputs if not c.ignored and any(e.effect in ("replace", "restart")
                                                                      for e in c.effects)]
        if self.action == REPLACE:
            paths = [c.path for c in self.inputs if not c.ignored and _replaces(c, self.head)] or paths
        return ", ".join(dict.fromkeys(_general(p) for p in paths))


@dataclass
class StackDiff:
    stack: str
    base: Mapping[str, Any] | None  # the snapshot's stack entry, None where the stack is absent
    head: Mapping[str, Any] | None
    files: list[FileChange] = field(default_factory=list)
    resources: list[ResourceChange] = field(default_factory=list)
    # what the rules derive from a side once and share (kilonode.review.sides: preflight's inputs)
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def changed(self) -> bool:
        return bool(self.files or self.resources or self.errors or self.images_changed)

    def note(self, text: str) -> None:
        """What a rule could not judge in this change: the report's "Not judged" line, so that no
        risk found is never read as safe."""
        notes = self.derived.setdefault("notes", [])
        if text not in notes:
            notes.append(text)

    @property
    def notes(self) -> list[str]:
        return list(self.derived.get("notes", []))

    @property
    def images_changed(self) -> bool:
        """What an image the stack boots would carry differs (its recipe's pins, binaries,
        kernel, files), with or without a new version: kilonode.review.images tells it."""
        base, head = (self.base or {}).get("imageContents"), (self.head or {}).get("imageContents")
        return isinstance(base, Mapping) and isinstance(head, Mapping) and "error" not in base \
            and "error" not in head and base != head

    @property
    def errors(self) -> list[str]:
        return [f"{side}: {entry['error']}" for side, entry in (("base", self.base), ("head", self.head))
                if entry and "error" in entry]


# The keys that name a list item, first match wins: Azure's sub-resources (security rules, IP
# configurations, frontends, probes) and Kubernetes' named items (containers, env, ports,
# volumes) carry `name`; a list of strings is a set of values (address prefixes, port ranges).
IDENTITY_KEYS = ("name", "key", "mountPath", "containerPort")


def _identity(items: list[Any]) -> str | None:
    """The key every item of `items` has, uniquely, if any."""
    if not all(isinstance(v, Mapping) for v in items):
        return None
    for key in IDENTITY_KEYS:
        values = [v.get(key) for v in items]
        if all(isinstance(x, str | int) and not isinstance(x, bool) and str(x) for x in values) \
                and len(set(map(str, values))) == len(values):
            return key
    return None


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaf paths and values. List items are placed by identity, not position, where they have
    one (`securityRules[name=allow-ssh].access`): a rule inserted before others then reads as one
    new rule, not as every later rule changed into its neighbour. A list of plain values is one
    leaf, shown whole (address prefixes, zones, a container's args)."""
    if isinstance(value, Mapping) and value:
        for k in sorted(value):
            yield from flatten(value[k], f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list) and value:
        key = _identity(value)
        if key is not None:
            for v in value:
                yield from flatten(v, f"{prefix}[{key}={v[key]}]")
        elif all(isinstance(v, str | int | float | bool) for v in value):
            yield prefix, list(value)  # whole: the order of args matters, a prefix list reads best whole
        else:
            for i, v in enumerate(value):
                yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _input_changes(type_: str, before: Mapping[str, Any], after: Mapping[str, Any],
                   ignore: Sequence[str]) -> list[InputChange]:
    old, new = dict(flatten(before)), dict(flatten(after))
    rules = effects().get(type_, ())
    found = []
    for path in sorted(old.keys() | new.keys(), key=natural):
        if old.get(path, _MISSING) == new.get(path, _MISSING):
            continue
        ignored = covers(path, ignore)
        found.append(InputChange(path, old.get(path), new.get(path), tuple(e for e in rules if matches(e, path)),
                                 ignored))
    return found


_MISSING = object()


def _replaces(change: InputChange, head: Mapping[str, Any] | None) -> bool:
    if any(e.effect == "replace" for e in change.effects):
        return True
    return covers(change.path, (head or {}).get("replaceOnChanges") or [])


def _role(resource: Mapping[str, Any]) -> str | None:
    tags = (resource.get("inputs") or {}).get("tags") or {}
    return tags.get("kilonode-role") if isinstance(tags, Mapping) else None


def compare_resources(base: Sequence[Mapping[str, Any]], head: Sequence[Mapping[str, Any]]) -> list[ResourceChange]:
    """Custom resources only (components have no inputs of their own), in the head's order with
    deletions after."""
    old = {(r["type"], r["name"]): r for r in base if r.get("custom", True)}
    new = {(r["type"], r["name"]): r for r in head if r.get("custom", True)}
    found: list[ResourceChange] = []
    for key, after in new.items():
        before = old.get(key)
        if before is None:
            found.append(ResourceChange(*key, action=CREATE, role=_role(after), protect=(False, after["protect"]),
                                        head=after))
            continue
        inputs = _input_changes(key[0], before["inputs"], after["inputs"], after.get("ignoreChanges") or [])
        protect = (bool(before["protect"]), bool(after["protect"]))
        applied = [c for c in inputs if not c.ignored]
        if not inputs and protect[0] == protect[1]:
            continue
        action = REPLACE if any(_replaces(c, after) for c in applied) else UPDATE
        found.append(ResourceChange(*key, action=action, role=_role(after) or _role(before), inputs=tuple(inputs),
                                    protect=protect, base=before, head=after))
    for key, before in old.items():
        if key not in new:
            found.append(ResourceChange(*key, action=DELETE, role=_role(before), protect=(before["protect"], False),
                                        base=before))
    return found


def compare_files(base: Mapping[str, str], head: Mapping[str, str]) -> list[FileChange]:
    found = []
    for path in sorted(base.keys() | head.keys(), key=natural):
        before, after = base.get(path), head.get(path)
        if before == after:
            continue
        status = "added" if before is None else "removed" if after is None else "modified"
        lines = difflib.unified_diff((before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        found.append(FileChange(path, status, text))
    return found


def compare_stack(stack: str, base: Mapping[str, Any] | None, head: Mapping[str, Any] | None) -> StackDiff:
    diff = StackDiff(stack, base, head)
    if (base and "error" in base) or (head and "error" in head):
        return diff
    diff.files = compare_files((base or {}).get("files", {}), (head or {}).get("files", {}))
    diff.resources = compare_resources((base or {}).get("resources", []), (head or {}).get("resources", []))
    return diff


def short(value: Any, limit: int = 80) -> str:
    """A value as one short line for a report."""
    if value is None:
        return "(none)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(before: Any, after: Any, limit: int = 80) -> tuple[str, str]:
    """Two values for a report line: whole where they fit, else the window where they differ
    (from the first differing character, with the common start elided) so that the two never
    read the same when they are not."""
    old, new = short(before, 10**9), short(after, 10**9)
    if len(old) <= limit and len(new) <= limit:
        return old, new
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    begin = max(0, start - limit // 4)

    def window(text: str) -> str:
        part = text[begin:begin + limit]
        return ("…" if begin else "") + part + ("…" if begin + limit < len(text) else "")

    return window(old), window(new)

