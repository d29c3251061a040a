"""A catalogue fact changed (`catalogue-fact-changed`): the catalogue (infra/kilonode/catalog/*.yaml) holds what
Azure, Kubernetes and the upstream projects document, each row with the `source` it was read from
(kilonode.catalog). A change to a row's value is a claim that upstream says something else: every plan that
derives from it moves with it (a sizing, a ceiling, a replica count), and the rules that judge the plan judge it
against the new value, so a wrong number passes them all. The fourteenth independent trace of `kilonode diff`
found it so: calicoTypha.nodesPerReplica 200 -> 1000 (limits.yaml), its source still reading "maxNodesPerTypha
:= 200", cut Typha from 39 replicas to 9 at 7,500 nodes, 5x past the Tigera operator's ceiling, and the review
said "No risk found".

Said once per review (the catalogue is the toolkit's, not a stack's), from the two refs' files themselves (git):
each changed leaf with its row's `source` on both sides. High where the value moved and the row's source did
not while it names the old value and not the new one (the catalogue now contradicts its own citation); medium
otherwise (a new source to check, rows added or removed). Text fields (source, note, why, message, summary,
description) are the citation, not the fact: said only through the rows they belong to.

Not read: a user's own repository, whose catalogue is the installed kilonode's (kilonode.review.refs pin_note
says the pin moved instead); the TOML tables (effects.toml: what a change does, read by the review itself).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from kilonode.review.finding import HIGH, MEDIUM
from kilonode.yamlio import load_yaml

CATALOGUE = "infra/kilonode/catalog/"
RULE = "catalogue-fact-changed"
TEXT_KEYS = frozenset({"source", "sources", "note", "notes", "why", "message", "summary", "description", "skew",
                       "whyPool", "reason"})
SHOWN = 6  # rows named in the line; the rest counted


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            name = _name(item)
            yield from _leaves(item, (*path, f"[{name}]" if name is not None else f"[{index}]"))
    else:
        yield path, value


def _source(document: Any, path: tuple[str, ...]) -> str:
    """The nearest `source` at or above the leaf's row."""
    nodes = [document]
    node = document
    for key in path[:-1]:
        if isinstance(node, Mapping):
            node = node.get(key)
        elif isinstance(node, list):
            node = next((i for n, i in enumerate(node) if key in (f"[{n}]", f"[{_name(i)}]")), None)
        nodes.append(node)
    for node in reversed(nodes):
        if isinstance(node, Mapping) and node.get("source"):
            found = node["source"]
            return " ".join(map(str, found)) if isinstance(found, list) else str(found)
    return ""


def _name(item: Any) -> str | None:
    if isinstance(item, Mapping):
        name = item.get("name") or item.get("id") or item.get("field")
        return name if isinstance(name, str) else None
    return None


def _load(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return None


def _facts(document: Any) -> dict[tuple[str, ...], Any]:
    return {p: v for p, v in _leaves(document) if not (set(p) & TEXT_KEYS)}


def _mentions(text: str, value: Any) -> bool:
    return bool(re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])", text))


def changes(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[tuple[str, str, bool]]:
    """(file, what moved, whether it contradicts its unchanged source) per changed fact of the catalogue files
    given as text on each side (None: absent on that side)."""
    found = []
    for name in sorted(set(before) | set(after)):
        old_doc, new_doc = _load(before.get(name)), _load(after.get(name))
        old, new = _facts(old_doc), _facts(new_doc)
        short = name.removeprefix(CATALOGUE)
        added = [p for p in new if p not in old]
        removed = [p for p in old if p not in new]
        for path in sorted(p for p in old.keys() & new.keys() if old[p] != new[p]):
            was_source, now_source = _source(old_doc, path), _source(new_doc, path)
            contradicts = (bool(was_source) and was_source == now_source and _mentions(was_source, old[path])
                           and not _mentions(was_source, new[path]))
            said = f"{short} {'.'.join(path)} {old[path]!r} -> {new[path]!r}"
            if contradicts:
                said += f" while its source still reads {old[path]!r} ({was_source[:160]})"
            elif was_source != now_source:
                said += f" with a new source ({now_source[:160]})"
            else:
                said += " under an unchanged source" + (f" ({was_source[:160]})" if was_source else "")
            found.append((short, said, contradicts))
        if added:
            found.append((short, f"{short}: {len(added)} value(s) added ({'.'.join(added[0])}...)", False))
        if removed:
            found.append((short, f"{short}: {len(removed)} value(s) removed ({'.'.join(removed[0])}...)", False))
    return found


def read(repo: Path, base: str, head: str | None, paths: list[str]) -> tuple[dict[str, str | None],
                                                                           dict[str, str | None]]:
    """Each changed catalogue YAML file's text at base and head (head None: the working tree)."""
    def show(commit: str, path: str) -> str | None:
        done = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=repo, capture_output=True, text=True,
                              check=False, timeout=60)
        return done.stdout if done.returncode == 0 else None

    chosen = [p for p in paths if p.startswith(CATALOGUE) and p.endswith((".yaml", ".yml"))]
    before = {p: show(base, p) for p in chosen}
    after = {p: (show(head, p) if head else ((repo / p).read_text(encoding="utf-8") if (repo / p).is_file()
                                               else None)) for p in chosen}
    return before, after


def assess(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(level, summary, subjects): one line for the catalogue's changed facts, or none."""
    found = changes(before, after)
    if not found:
        return []
    contradicted = [said for _, said, bad in found if bad]
    shown = (contradicted + [said for _, said, bad in found if not bad])[:SHOWN]
    more = len(found) - len(shown)
    level = HIGH if contradicted else MEDIUM
    summary = (
        f"{len(found)} catalogue fact(s) changed: {'; '.join(shown)}" + (f"; and {more} more" if more else "")
        + ". The catalogue states what upstream documents; every plan derives from it and every rule judges the "
        "plan against it, so a wrong value passes them all"
        + (" (the value no longer matches the source it cites)" if contradicted else "")
        + ". Check each new value against the cited source at the pinned version and change the source with it "
        "(docs/style.md: every outside fact lives once in the catalogue with its source)")
    return [(level, summary, tuple(sorted({f for f, _, _ in found})))]
