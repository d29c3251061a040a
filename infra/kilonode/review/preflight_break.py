"""A break preflight finds at the head and not at the base (`preflight-break`, high): whatever a
change does, if `kilonode preflight` calls the head's bring-up broken where the base's was not,
`pulumi up` refuses the run before it changes anything (its preflight gate,
kilonode.azure.program.preflight_gate: the same checks in a child process, any break stops
the run), and applied another way (kubectl, the portal, an older kilonode) the break is what the
cluster gets. The review runs preflight's own checks (kilonode.preflight.run.CHECKS) on both
sides' inputs (kilonode.review.sides, built once per side and shared with placement and network)
and reports each new break in preflight's words, with its fix (one line per check and fix: one
decision's breaks together), so that no change that preflight
would stop is called "No risk found" by a review whose narrower rules missed it.

Cost: preflight's checks take about 1.4 s of CPU per side on research-7500. A change touching
nothing preflight reads (only images: the sides' inputs hold no image manifest) runs none; the
head runs every check first, and the base only the checks that broke at the head (a check that
finds no break at the head has none to be new), so an ordinary change pays one side's run.

Not judged: the breaks about resource options (customTimeouts, ignoreChanges: BLIND) on a side
whose resources carry none of them, a snapshot recorded before they were (format 1). Not said again: the breaks
placement and network already report from the same preflight model
(scheduling's and connections' breaks whose subject a daemonset-stranded, workload-unplaceable,
connection-refused or nsg-shadowed line names). A break is the same on both sides when its
check, subject and fix are (its text may carry counts that move with the change).

Pure: a StackDiff and the risks found so far in, findings out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from kilonode.preflight.checks import admission_requests
from kilonode.preflight.model import Finding as Break
from kilonode.preflight.model import Inputs
from kilonode.preflight.run import CHECKS
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, Finding

RULE = "preflight-break"
# Rules that already tell a break of these checks, from preflight's own model, by subject.
TOLD_BY = {"scheduling": ("daemonset-stranded", "workload-unplaceable"),
           "connections": ("connection-refused", "nsg-shadowed")}
GATE = ("`pulumi up` refuses the whole run before it changes anything (its preflight gate, "
        "kilonode.azure.program.preflight_gate); applied past the gate (kubectl, another tool), the break is what the "
        "cluster gets")


def relevant(diff: StackDiff) -> bool:
    """Preflight reads the plan, the rendered files and the recorded resources: a change to none
    of them (an image alone) moves no check."""
    return bool(diff.resources or diff.files)


def _key(found: Break) -> tuple[str, str, str]:
    return found.check, found.where, found.fix


# Resource options the review's snapshots do not record (kilonode.review.snapshot keeps each
# resource's type, name, inputs and protect): on a side whose resources carry none of an option,
# the breaks that judge it (their fix names it) say what the snapshot lacks, not what the program does.
BLIND = {"customTimeouts": ("customTimeouts", "lengthen its await"), "ignoreChanges": ("ignoreChanges",)}


def _blind(inputs: Inputs) -> tuple[str, ...]:
    """The fix phrases of the breaks this side's inputs cannot judge."""
    recorded = {"customTimeouts": any(r.custom_timeouts for r in inputs.resources),
                "ignoreChanges": any(getattr(r, "ignore_changes", ()) for r in inputs.resources)}
    return tuple(phrase for option, phrases in BLIND.items() if not recorded[option] for phrase in phrases)


def _run(inputs: Inputs, names: Iterable[str], diff: StackDiff) -> list[Break]:
    wanted, blind = set(names), _blind(inputs)
    found = []
    for check in (c for c in CHECKS if c.name in wanted):
        try:
            scoped, scope = SCOPED.get(check.name), _scope(check.name, diff)
            run = scoped(inputs, *scope) if scoped is not None and scope is not None else check.run(inputs)
            breaks = [f for f in run if f.level == "break"]
        except Exception as error:
            diff.note(f"preflight's {check.name} check could not read {inputs.source}: {error}")
            continue  # a side a check cannot read is said in the notes, not fatal to the review
        found += [f for f in breaks if not any(phrase in f.fix for phrase in blind)]
    return found


# Checks whose verdict moves only with what the change touches, and costly enough to skip where
# it does not (a one-line change to research-7500 must stay a review of seconds): admission-requests
# runs cel-python's interpreter over each pool role's Node writes (about 0.3 s of CPU a role and
# policy, several seconds on research-7500), and its inputs are the admission policies and how each
# pool's nodes register (their kubelet's files). A change to one policy moves that policy's verdict
# on every role; a change to some roles' kubelet files moves every policy's verdict on those roles:
# only that is evaluated (SCOPED, with the roles and the policies).
MOVED_BY: dict[str, tuple[str, ...]] = {
    "admission-requests": ("kubernetes:admissionregistration.k8s.io/",),
}
POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
SCOPED: dict[str, Callable[[Inputs, Collection[str], Collection[str]], list[Break]]] = {
    "admission-requests": admission_requests.check_scoped,
}


def _kubelet_hosts(diff: StackDiff) -> set[str]:
    return {f.host for f in diff.files if f.host.startswith("pool-") and "kubelet" in f.path}


def _policies(diff: StackDiff) -> set[str]:
    """The metadata.name of each ValidatingAdmissionPolicy the change creates, updates or deletes (a
    binding alone moves nothing admission-requests reads: it evaluates every policy as bound)."""
    return {str(((side or {}).get("inputs") or {}).get("metadata", {}).get("name"))
            for c in diff.resources if c.type == POLICY for side in (c.base, c.head) if side}


def _moved(check: str, diff: StackDiff) -> bool:
    """Whether the change can move `check`'s verdict (a check not in MOVED_BY always can)."""
    types = MOVED_BY.get(check)
    if types is None:
        return True
    return bool(_policies(diff)) or bool(_kubelet_hosts(diff))


def _scope(check: str, diff: StackDiff) -> tuple[set[str], set[str]] | None:
    """What a scoped check need judge: the pool roles whose kubelet files the change touches, and the
    policies it changes; None (everything) for a check not in MOVED_BY."""
    if check not in MOVED_BY:
        return None
    return _kubelet_hosts(diff), _policies(diff)


def new_breaks(diff: StackDiff) -> list[Break] | None:
    """The head's breaks the base does not have; None where either side has no preflight inputs.
    Kept on the diff: computed once per review of a stack."""
    if "preflight:new" in diff.derived:
        return diff.derived["preflight:new"]  # type: ignore[no-any-return]
    base, head = sides.inputs(diff, "base"), sides.inputs(diff, "head")
    found: list[Break] | None = None
    if base is not None and head is not None:
        at_head = _run(head, (c.name for c in CHECKS if _moved(c.name, diff)), diff)
        before = {_key(f) for f in _run(base, {f.check for f in at_head}, diff)} if at_head else set()
        found = [f for f in at_head if _key(f) not in before]
    diff.derived["preflight:new"] = found
    return found


def _told(found: Break, told: Sequence[tuple[str, Sequence[str], str]]) -> bool:
    """Whether a placement or network line names the break's subject already: its `where` whole
    ("Deployment kube-system/x", a host), or a DaemonSet's "<kind> <namespace>/<name> on <pool>" as
    placement names it ("DaemonSet <name>" and the pool among its subjects)."""
    rules = TOLD_BY.get(found.check, ())
    what, _, pool = found.where.partition(" on ")
    kind, _, qualified = what.partition(" ")
    short = f"{kind} {qualified.rpartition('/')[2]}"
    for rule, subjects, summary in told:
        if rule not in rules:
            continue
        if found.where in subjects or found.where in summary:
            return True
        if pool and short in subjects and pool in subjects:
            return True
    return False


SHOWN = 6  # the breaks of one decision said in full; the rest named


def assess(diff: StackDiff, told: Sequence[tuple[str, Sequence[str], str]] = ()) -> list[Finding]:
    """One line per decision: the new breaks of one check with one fix together (kube-system's level
    refusing every node agent is one change). `told`: (rule, subjects, summary) of the risks found so far."""
    if diff.base is None or diff.head is None or not relevant(diff):
        return []
    found = new_breaks(diff)
    if found is None:
        why = sides.why_not(diff, "base") or sides.why_not(diff, "head")
        diff.note(f"preflight's checks on both sides: {why}")
        return []
    groups: dict[tuple[str, str], list[Break]] = {}
    for f in found:
        if not _told(f, told):
            groups.setdefault((f.check, f.fix), []).append(f)
    findings = []
    for (check, fix), breaks in groups.items():
        said = "; ".join(f"{f.where}: {f.what}" for f in breaks[:SHOWN])
        rest = breaks[SHOWN:]
        more = f"; and {len(rest)} more: {', '.join(f.where for f in rest)}" if rest else ""
        count = f"{len(breaks)} breaks" if len(breaks) > 1 else "a break"
        findings.append(Finding(HIGH, RULE, (
            f"preflight's {check} check finds {count} at the head that the base does not have: {said}{more}. "
            f"Preflight calls it a break, so {GATE}. Fix: {fix}"), tuple(sorted({f.where for f in breaks}))))
    return findings
