"""Review of infra changes: `kilonode diff` renders and records each affected stack at two git
refs and reports what changed and what it risks; the policy pack (policy/) enforces the same
invariants at `pulumi preview`.

    snapshot (one side, run per ref) -> compare (files, resources) -> risks -> report
    refs: the git side (checkouts, affected stacks); snapcache: a side's snapshot kept by the
    content of its inputs; rules: the invariants both share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kilonode.review.compare import compare_stack
from kilonode.review.refs import (
    ReviewError,
    Side,
    affected,
    changed_paths,
    pin_note,
    resolve,
    snapshots,
    stacks_at,
    toplevel,
)

if TYPE_CHECKING:
    from kilonode.review.report import Review

__all__ = ["Review", "ReviewError", "review"]


def __getattr__(name: str) -> Any:
    # The report and the rules (and through them preflight's models: ~1.5 s of imports) load while
    # the snapshots render (`_load_rules`), on the cores the children leave, not before they start.
    if name == "Review":
        from kilonode.review.report import Review

        return Review
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_rules() -> None:
    """What judges the snapshots, imported while the children render them."""
    import kilonode.review.report
    import kilonode.review.risks  # noqa: F401


def review(start: Path, base: str, head: str | None = None, stacks: Sequence[str] = (),
           progress: Callable[[str], None] = lambda _: None, cache: bool = True) -> Review:
    """Compare the stacks a change touches (or `stacks`) between `base` and `head` (None: the
    working tree) of the git checkout holding `start`. `cache`: read and keep each side's
    snapshot by the content of its inputs (kilonode.review.snapcache)."""
    from kilonode.paths import user_project

    began = time.monotonic()
    repo = toplevel(start)
    project = user_project(start)
    if project is not None and project != repo.resolve():
        raise ReviewError(f"{project} is a kilonode project in a subfolder of the repository {repo}: kilonode diff "
                          "reads stacks/ and the toolkit at the repository's root, so keep the project at the root "
                          "of its own repository (as `kilonode new` makes it); a project in a subfolder is not "
                          "supported yet")
    base_side = Side("base", base, resolve(repo, base))
    head_side = Side("head", head, resolve(repo, head)) if head else Side("head", "working tree", None)
    at_base, at_head = stacks_at(repo, base_side.commit), stacks_at(repo, head_side.commit)
    known = at_base | at_head
    if stacks:
        unknown = sorted(set(stacks) - known)
        if unknown:
            raise ReviewError(f"no stack named {', '.join(unknown)} at either ref (stacks/Pulumi.<name>.yaml); "
                              f"known: {', '.join(sorted(known)) or 'none'}")
        chosen, why = sorted(set(stacks)), "chosen with --stack"
    else:
        chosen, why = affected(changed_paths(repo, base_side.commit or "", head_side.commit), known)
    taken = snapshots(repo, [(base_side, [s for s in chosen if s in at_base]),
                             (head_side, [s for s in chosen if s in at_head])], progress, cache,
                      meanwhile=_load_rules) if chosen else {}
    from kilonode.review.decisions import order
    from kilonode.review.report import Review
    from kilonode.review.risks import MEDIUM, Risk, assess

    result = Review(base_side, head_side, chosen, why)
    note = pin_note(repo, base_side.commit or "", head_side.commit)
    if note is not None:
        progress(note)
        result.notes.append(note)
    if chosen:
        lessons = taken["base"].get("lessons", {})
        for name in chosen:
            diff = compare_stack(name, taken["base"]["stacks"].get(name), taken["head"]["stacks"].get(name))
            result.diffs.append(diff)
            if diff.head is None:
                result.risks.append(Risk(MEDIUM, "stack-removed", name,
                                         "the stack file is gone at the head: nothing here deletes the cluster, but "
                                         "its resources would go with `pulumi destroy`; keep its state until then"))
            elif diff.changed:
                result.risks += assess(diff, lessons)
                result.notes += [f"{name}: {note}" for note in diff.notes]
    # the catalogue's facts are the toolkit's, not a stack's: said once (kilonode.review.catalogue_facts)
    from kilonode.review import catalogue_facts

    paths = changed_paths(repo, base_side.commit or "", head_side.commit)
    for level, summary, subjects in catalogue_facts.assess(*catalogue_facts.read(
            repo, base_side.commit or "", head_side.commit, paths)):
        result.risks.append(Risk(level, catalogue_facts.RULE, ", ".join(chosen) or "toolkit", summary, subjects))
    result.risks.sort(key=order)  # highest impact first (kilonode.review.decisions)
    result.seconds = time.monotonic() - began
    return result
