"""A review in three forms: JSON (everything, for tools and the CI artefact), text (everything,
for a terminal) and Markdown (one pull-request comment: summary and risks first, the same host
change on several machines shown once, long diffs collapsed, cut with a pointer to the full
report when over GitHub's 65,536 characters).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kilonode.review import images
from kilonode.review.compare import (
    CREATE,
    DELETE,
    REPLACE,
    UPDATE,
    FileChange,
    ResourceChange,
    StackDiff,
    natural,
)
from kilonode.review.compare import shown as pair
from kilonode.review.decisions import NOT_JUDGED, decisions
from kilonode.review.refs import Side
from kilonode.review.risks import HIGH, MEDIUM, Risk

# GitHub refuses a comment body over 65,536 characters; a margin for the workflow's own lines.
COMMENT_LIMIT = 65_536
MARKDOWN_BUDGET = 60_000
MARKER = "<!-- kilonode-diff -->"  # how the workflow finds its own comment to update it
ACTIONS = (REPLACE, DELETE, UPDATE, CREATE)
ICON = {HIGH: "🔴", MEDIUM: "🟠"}


@dataclass
class Review:
    base: Side
    head: Side
    stacks: list[str]
    why: str  # why these stacks
    diffs: list[StackDiff] = field(default_factory=list)
    risks: list[Risk] = field(default_factory=list)
    # what the rules could not judge in this change (no promtool, a side's plan unreadable, ...)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def changed(self) -> list[StackDiff]:
        return [d for d in self.diffs if d.changed]

    def level(self) -> str | None:
        levels = {r.level for r in self.risks}
        return HIGH if HIGH in levels else MEDIUM if MEDIUM in levels else None


def _side(side: Side) -> str:
    return side.ref if side.commit is None else f"{side.ref} ({side.commit[:12]})"


def _counts(diff: StackDiff) -> str:
    actions = [sum(1 for r in diff.resources if r.action == a) for a in ACTIONS]
    words = {REPLACE: "replaced", DELETE: "deleted", UPDATE: "updated", CREATE: "created"}
    parts = [f"{n} {words[a]}" for a, n in zip(ACTIONS, actions, strict=True) if n]
    hosts = sorted({f.host or "(stack)" for f in diff.files})
    files = f"{len(diff.files)} rendered file(s) in {len(hosts)} place(s)" if diff.files else "no rendered file"
    shown = [key for key, (was, now, lines) in images.changes(diff).items() if lines]
    carried = f"; {len(shown)} image(s) carry other pins" if shown else ""
    return f"resources: {', '.join(parts) or 'none changed'}; {files} changed{carried}"


def summary(review: Review) -> str:
    head = f"kilonode diff: base {_side(review.base)} → head {_side(review.head)}."
    if not review.stacks:
        return f"{head} No stack touched ({review.why}): no changes."
    changed = review.changed
    if not changed:
        return (f"{head} {len(review.stacks)} stack(s) checked ({review.why}): no changes: the rendered files and "
                "the resource graph are identical at both refs.")
    high = sum(r.level == HIGH for r in review.risks)
    medium = sum(r.level == MEDIUM for r in review.risks)
    risk = (f"Risk: **{review.level()}** ({high} high, {medium} medium)." if review.risks
            else "No risk found by the rules, which is not the same as safe: see what they do not judge.")
    parts = [f"{d.stack}: {_counts(d)}" for d in changed]
    return f"{head} {len(review.stacks)} stack(s) checked ({review.why}). " + "; ".join(parts) + ". " + risk


# --- JSON ------------------------------------------------------------------------------

def _resource_json(c: ResourceChange) -> dict[str, Any]:
    return {
        "type": c.type, "name": c.name, "action": c.action, "role": c.role,
        "protect": {"before": c.protect[0], "after": c.protect[1]},
        "inputs": [{"path": i.path, "before": i.before, "after": i.after, "ignored": i.ignored,
                    "effects": [{"effect": e.effect, "why": e.why, "source": e.source,
                                 **({"unverified": True} if e.unverified else {})} for e in i.effects]}
                   for i in c.inputs],
    }


def to_json(review: Review) -> str:
    return json.dumps({
        "summary": summary(review).replace("**", ""),
        "base": {"ref": review.base.ref, "commit": review.base.commit},
        "head": {"ref": review.head.ref, "commit": review.head.commit},
        "stacks": review.stacks, "why": review.why, "level": review.level(),
        "risks": [r.to_json() for r in review.risks],
        "decisions": [{"level": d.level, "rule": d.lead.rule, "stack": d.lead.stack, "cause": d.lead.cause,
                       "findings": 1 + len(d.others), "line": d.line()} for d in decisions(review.risks)],
        "notJudged": not_judged(review),
        "changes": {d.stack: {"errors": d.errors,
                              "resources": [_resource_json(c) for c in d.resources],
                              "files": [{"path": f.path, "status": f.status, "diff": f.diff} for f in d.files]}
                    for d in review.diffs},
        "seconds": round(review.seconds, 2),
    }, indent=2, sort_keys=False) + "\n"


# --- shared pieces -----------------------------------------------------------------------

def _what(c: ResourceChange, limit: int = 4) -> str:
    if c.action == CREATE:
        return "new"
    if c.action == DELETE:
        return "deleted" + (" (was protected: `pulumi up` stops at it)" if c.protect[0] else "")
    shown = []
    for i in c.inputs[:limit]:
        effect = sorted({e.effect for e in i.effects} - {"in-place"})
        note = " [ignored: ignoreChanges]" if i.ignored else (f" [{', '.join(effect)}]" if effect else "")
        was, now = pair(i.before, i.after, 60)
        shown.append(f"{i.path}: {was} → {now}{note}")
    if len(c.inputs) > limit:
        shown.append(f"and {len(c.inputs) - limit} more input(s)")
    if c.protect[0] != c.protect[1]:
        shown.append(f"protect: {c.protect[0]} → {c.protect[1]}")
    return "; ".join(shown)


def _action(c: ResourceChange) -> str:
    if c.action == UPDATE and "restart" in c.kinds:
        return "update (restarts)"
    if c.action == UPDATE and "rollout" in c.kinds:
        return "update (rollout)"
    return c.action


def _relative(change: FileChange) -> tuple[str, str]:
    """(path within its host, diff body without the header): the key that finds the same
    change on several hosts."""
    inner = change.path.split("/", 1)[1] if "/" in change.path else change.path
    body = "".join(change.diff.splitlines(keepends=True)[2:])
    return inner, body


def grouped_files(files: Sequence[FileChange]) -> list[tuple[FileChange, list[str]]]:
    """Each distinct change once, with every host it appears on."""
    groups: dict[tuple[str, str], tuple[FileChange, list[str]]] = {}
    for f in files:
        key = _relative(f)
        if key in groups:
            groups[key][1].append(f.host)
        else:
            groups[key] = (f, [f.host])
    return list(groups.values())


def _hosts(hosts: list[str]) -> str:
    named = [h for h in hosts if h]
    return ", ".join(named) if named else "(stack)"


# --- text --------------------------------------------------------------------------------

def not_judged(review: Review) -> list[str]:
    """The answer's last lines: what no rule models, and what this review could not check."""
    if not review.changed:
        return []
    return [f"Not judged: {NOT_JUDGED}.", *(f"Not judged here: {note}" for note in review.notes)]


def to_text(review: Review) -> str:
    lines = [summary(review).replace("**", ""), ""]
    answer = decisions(review.risks)
    if answer:
        lines.append("Answer (one line per decision, highest impact first):")
        lines += [f"  - [{d.level}] {d.line()}" for d in answer]
        lines.append("")
    lines += [*not_judged(review), ""] if review.changed else []
    fanned = [r for d in answer for r in d.others]
    if fanned:
        lines.append("The same decisions' other findings, in full:")
        lines += [f"  [{r.level}] {r.rule} ({r.stack}): {r.summary}" for r in fanned]
        lines.append("")
    for d in review.diffs:
        if not d.changed:
            continue
        lines += [f"== {d.stack} ==", ""]
        lines += [f"  error: {e}" for e in d.errors]
        lines += [f"  {line}" for line in images.describe(d)]
        for c in d.resources:
            lines.append(f"  {_action(c):<17} {c.type} {c.name}")
            for i in c.inputs:
                note = " (ignored: ignoreChanges)" if i.ignored else ""
                was, now = pair(i.before, i.after, 200)
                lines.append(f"      {i.path}: {was} -> {now}{note}")
                lines += [f"          {e.effect}: {e.why} [{e.source}]" for e in i.effects]
            if c.protect[0] != c.protect[1]:
                lines.append(f"      protect: {c.protect[0]} -> {c.protect[1]}")
        if d.resources:
            lines.append("")
        for f, hosts in grouped_files(d.files):
            also = [h for h in hosts[1:] if h]
            lines.append(f"  {f.path} ({f.status})" + (f", the same change in {', '.join(also)}" if also else ""))
            lines += ["    " + line for line in f.diff.splitlines()]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# --- Markdown ----------------------------------------------------------------------------

def _fence(text: str, lang: str = "diff") -> str:
    fence = "```" + ("`" if "```" in text else "")
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _resources_table(d: StackDiff, rows: int) -> list[str]:
    ordered = sorted(d.resources, key=lambda c: (ACTIONS.index(c.action), c.type, c.name))
    lines = ["| action | resource | type | what changed |", "|---|---|---|---|"]
    for c in ordered[:rows]:
        lines.append(f"| {_action(c)} | `{c.name}` | `{c.type.split(':')[-1]}` | {_cell(_what(c))} |")
    if len(ordered) > rows:
        lines.append(f"| … | {len(ordered) - rows} more | | in the full report |")
    return lines


def to_markdown(review: Review, full_report: str = "`kilonode diff --format text` (or the JSON artefact)",
                budget: int = MARKDOWN_BUDGET) -> str:
    """One comment, at most `budget` characters: summary and risks always, then per stack the
    resource table and the host-file diffs, shrunk until it fits."""
    head = [MARKER, "## kilonode diff", "", summary(review), ""]
    answer = decisions(review.risks)
    if answer:
        head += ["### Risks: one line per decision, highest impact first", ""]
        head += [f"- {ICON[d.level]} **{d.level}** `{d.lead.rule}` {d.line().removeprefix(d.lead.rule + ' ')}"
                 for d in answer]
        head.append("")
    head += [*(f"_{line}_" for line in not_judged(review)), ""] if review.changed else []
    for rows, diff_lines in ((200, 400), (60, 120), (25, 40), (10, 0)):
        body = _stacks_markdown(review, rows, diff_lines)
        text = "\n".join(head + body)
        if len(text) <= budget:
            return text + "\n"
    cut = "\n".join(head)[: budget - 400]
    return cut + f"\n\n… the report is cut here to fit one comment; the full report: {full_report}\n"


def _stacks_markdown(review: Review, rows: int, diff_lines: int) -> list[str]:
    lines: list[str] = []
    cut = False
    for d in review.changed:
        lines += [f"### {d.stack}", ""]
        lines += [f"- error: {e}" for e in d.errors]
        lines += [f"- {_cell(line)}" for line in images.describe(d)]
        if d.resources:
            lines += [*_resources_table(d, rows), ""]
            cut |= len(d.resources) > rows
        groups = grouped_files(d.files)
        if groups:
            hosts = sorted({f.host or "stack-wide" for f in d.files}, key=natural)
            named = ", ".join(hosts[:6]) + (f" and {len(hosts) - 6} more" if len(hosts) > 6 else "")
            lines += [f"<details><summary>Rendered files: {len(d.files)} changed ({named}); {len(groups)} distinct "
                      "change(s)</summary>", ""]
            for f, on in groups:
                diff = f.diff.splitlines()
                shown = diff[:diff_lines]
                also = f" (the same change on {_hosts(on)})" if len(on) > 1 else ""
                lines.append(f"`{f.path}` {f.status}{also}")
                lines.append("")
                if shown:
                    lines.append(_fence("\n".join(shown) + (f"\n… {len(diff) - len(shown)} more lines"
                                                              if len(diff) > len(shown) else "")))
                    lines.append("")
                cut |= len(diff) > len(shown)
            lines += ["</details>", ""]
    if cut:
        lines.append("Some tables and diffs are shortened to fit one comment; the full report: "
                     "`kilonode diff --format text` (or the JSON artefact).")
    return lines


FORMATS = {"json": to_json, "text": to_text, "md": to_markdown}
