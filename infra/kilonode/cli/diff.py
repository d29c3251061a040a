"""`kilonode diff --base REF`: review an infra change the way a pull request needs it."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import die, err, fail_lines
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.review import Review


class DiffFormat(StrEnum):
    md = "md"
    json = "json"
    text = "text"


class FailOn(StrEnum):
    high = "high"
    medium = "medium"


def diff(
    base: Annotated[str, typer.Option("--base", help="The git ref the change starts from: a branch, tag, commit "
                                                     "or HEAD~1 (in CI: the pull request's base branch).",
                                      show_default=False, metavar="REF")],
    head: Annotated[str | None, typer.Option("--head", help="The ref with the change. Left out: the working tree, "
                                                            "uncommitted and untracked files included.",
                                             show_default=False, metavar="REF")] = None,
    stacks: Annotated[list[str] | None, typer.Option("--stack", help="Review this stack (repeatable). Left out: the "
                                                                     "stacks the change touches, found by itself.",
                                                     show_default=False, metavar="STACK")] = None,
    output_format: Annotated[DiffFormat, typer.Option(
        "--format", help="md: one pull-request comment (under 65,536 characters); text: everything, for a "
                         "terminal; json: everything, for tools.")] = DiffFormat.text,
    fail_on: Annotated[FailOn | None, typer.Option(
        "--fail-on", help=f"Exit {ExitCode.RISK:d} when a risk at this level or above is found (high; or medium, which "
                          "includes high).", show_default=False)] = None,
    write_json: Annotated[Path | None, typer.Option(
        "--write-json", help="Also write the full JSON report to this file (the CI artefact the comment points "
                             "to).", show_default=False, metavar="FILE")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Render both refs afresh: neither read nor write "
                                                              "~/.cache/kilonode/diff/ (see Cache).")] = False,
) -> None:
    # its help is HELP, below (a docstring that long would hide the code)

    from kilonode.review import ReviewError, review

    try:
        result = review(Path.cwd(), base, head, stacks or (), progress=lambda line: err.print(f"  {line}"),
                        cache=not no_cache)
    except ReviewError as error:
        die(str(error), "kilonode diff")
    # after the review: it loads these while its snapshots render (kilonode.review._load_rules)
    from kilonode.review.report import FORMATS, to_json
    from kilonode.review.risks import HIGH, MEDIUM

    _refuse_invalid_heads(result)
    if write_json is not None:
        _write_whole(write_json, to_json(result))
    sys.stdout.write(FORMATS[output_format.value](result))
    err.print(f"  reviewed {len(result.stacks)} stack(s) in {result.seconds:.1f} s")
    levels = {FailOn.high: {HIGH}, FailOn.medium: {HIGH, MEDIUM}}
    if fail_on is not None and any(r.level in levels[fail_on] for r in result.risks):
        err.print(f"[bold red]kilonode diff:[/] {fail_on.value} risk found "
                  f"(--fail-on {fail_on.value}): exit {ExitCode.RISK:d}")
        raise typer.Exit(code=ExitCode.RISK)


def _refuse_invalid_heads(result: Review) -> None:
    """A stack file the change leaves unloadable (refused by the loader every command and `pulumi
    up` use) ends the review as `validate` would: its problems, one line each, exit 2, nothing
    written, whatever --fail-on says: a CI step fails on it, and a hostile file's text never reaches
    a report (issue 37). A base that does not load is the medium `stack-invalid` risk; a stack that
    loads but whose program stops (a restart guard) is a risk too."""
    refused = [diff for diff in result.diffs if diff.head and "error" in diff.head and "files" not in diff.head]
    if refused:
        lines = [line for diff in refused for line in str(diff.head["error"]).splitlines() if line.strip()]
        fail_lines(", ".join(f"stacks/Pulumi.{diff.stack}.yaml" for diff in refused), lines)


def _write_whole(path: Path, text: str) -> None:
    """Written beside and renamed: the file is the whole report or the one before."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


# The command's --help (typer reads the function's docstring).
HELP = """Review an infra change: what it does to each cluster, and what it risks.

Renders every affected stack and records its Azure resource graph (Pulumi's mock engine,
nothing sent to Azure) at both refs, each with that ref's own code, from a scratch copy of
what rendering reads at that ref (the working tree itself when --head is left out). A
change to a stack file touches that stack; a change to the toolkit (infra/, templates/,
sysctl/, node-image/, pyproject.toml, Pulumi.yaml) touches every stack; docs and tests
touch none.

In your own project (made by `kilonode new`, at its repository's root) the code is the
installed kilonode, the same on both refs; a change to requirements.txt, catalog/ or
node-image/ touches every stack, and a changed pin is said in the report's notes (the
upgrade itself is not rendered at the base's version).

The report has, per stack: each resource created, updated (which inputs, and whether Azure
restarts the machine to apply them), replaced or deleted, with the source that says so
(the catalogue's effects.toml); the rendered files as unified diffs, custom data included
(secrets masked), the same change on several machines shown once; and the risks, each
with its level and reason:

- high: etcd members restarted or replaced past what the cluster tolerates
(quorum lost), every apiserver at once, a policy-pack invariant broken (the
events cluster removed, etcd's protection removed, etcd ports opened, ...), an
etcd quota lowered, etcd-leases-moved (the leases cluster added to or removed
from a running cluster), a pool shrunk by more than half, a subnet or static
address moved, an update Azure refuses; version-skew (images vs in-cluster
objects, either way), kubernetes-minor-jump, image-not-rebuilt (a preload or
binary the image version does not carry), world-open (0.0.0.0/0, *, Internet,
a public IP on the control plane), replace-stops ("pulumi up stops at X; do
Y"), container-replaced (the resource group or VNet), etcd-data-lost,
audit-log-off, daemonset-api-load, preflight-break (a break `kilonode
preflight` finds at the head and not at the base: `pulumi up` refuses the
run), admission-weakened (an admission policy binding without Deny, a
policy or binding deleted or narrowed), admission-plugins-changed (an admission
plugin kilonode relies on removed; AlwaysPullImages added where pools preload
images, medium without), autoscaler-scale-down-raised (cluster-autoscaler flags
that make more GPU nodes removable: their gangs evicted),
autoscaler-unready-guard-weakened (the halt on unready nodes raised, or unready
nodes removed sooner), alert-selects-no-job (a rule's job selector naming no job
Prometheus scrapes: its alerts never fire), rbac-escalation (a subject newly
granted an escalation path: nodes/proxy, pods/exec, Secrets, ...),
audit-secrets-logged (Secrets or tokens in the audit log above Metadata),
node-monitor-grace-lowered (nodes marked NotReady, their pods evicted, on any
control-plane blip), kubelet-node-writes-raised (Node writes x10), capacity-takes-over
(a scale set set to the plan's size whatever the autoscaler left),
gang-permit-wait-lowered (large gangs never assemble), gang-scheduler-broken,
pod-security-default-tightened (new pods refused in unlabelled namespaces),
scrape-limit-below-load (a job's every scrape fails), node-eviction-rate-raised,
event-ttl-raised (the Events etcd past its quota), dns-upstream-off-azure (private
names stop resolving), encryption-provider-dropped (stored Secrets unreadable),
lb-probe-not-readiness, proxy-felix-mode-mismatch, coredns-memory-short
(CoreDNS's memory limit below its estimate; every replica rolls); corefile-reloaded (pods verified past
CoreDNS's memory limit), apf-live-change (a level carrying node agents or the
controllers losing more than half its seats), scrape-config-rejected (a
Prometheus configuration promtool rejects), recording-rule-missing (alerts
reading a record no rule writes any more), dns-replicas-cut (CoreDNS's
autoscaler asking for less than half the replicas);

- medium: any etcd member or apiserver restarted, a fleet-wide rollout (every
node of a pool gets new custom data or a new image), a field lesson made
weaker (a sysctl below its field value, serialized image pulls by either
setting, the runtime root off the local disk), vnet-widened (in place, nothing
moves), subnet-unrecorded (run kilonode allocate), labels-until-reimaged,
corefile-reloaded (a Corefile change reaches every CoreDNS replica at once),
apf-live-change (a priority level or FlowSchema change every apiserver applies
at once, before any roll), dns-replicas-cut (fewer CoreDNS replicas, at once),
apiserver-load (fewer apiservers: each carries more watches, and higher
inflight limits), autoscaler-min-not-enforced (a raised autoscaler floor that
nothing scales up to), join-token-rotated (a rotation, or a registration group's token
Secrets deleted while its scale sets stay: a removed team),
autoscaler-flag-changed (a cluster-autoscaler flag no rule judges),
control-plane-flag-changed and kubelet-config-changed (a flag or field no rule
judges), autoscaler-floor-lowered (more of a pool's nodes removable),
custom-data-inert (a model change no running node acts on: do not roll),
daemonset-pacing-raised, alert-threshold-weakened, alert-page-lost (a paging
alert demoted or deleted), alert-deleted, value-effect (a valid value upstream
documents as dangerous: catalog/value_effects.yaml), catalogue-fact-changed (an
outside fact's value moved: high where its source still names the old one),
replicas-cut (a Deployment scaled down at once; Typha past its ratio),
autoscaled-model-put (autoscaled scale sets' models PUT: pause the autoscaler),
sysctl-not-in-pods (a namespaced sysctl pods never see), prometheus-disk-short
(retention past the claim Prometheus runs on), nodes-added (VMs created at once: quota),
ssh-keys-not-on-running-nodes, pool-capacity (a pool
too small for what must run there, or for what prefers it: the rest spills onto
other pools, GPU nodes named), etcd-retention-moot (etcd's own compaction
retention raised while the apiservers compact every 5 minutes: no more history,
every member replaced).

Each risk is one line per decision, with its count and hosts, highest first
(docs/review.md has the table with every rule's story).

A change of comments or formatting only reports "no changes".

Cache: each ref's recording is kept in ${XDG_CACHE_HOME:-~/.cache}/kilonode/diff/ (the
newest 24, ~2 MB per large stack), keyed by the content of what rendering reads there (the
toolkit and stacks/, uncommitted files included), the stacks, the snapshot code, Python
and the installed packages: a ref seen before (the same base under each pull request) is
read back, not rendered. A damaged entry is ignored and replaced; --no-cache bypasses it.

Examples:

  kilonode diff --base HEAD~1 --fail-on high

  kilonode diff --base origin/main --format md --write-json diff.json > comment.md

Exit status: 0, or 3 with --fail-on when such a risk is found; 2 when the review could
not be made (a bad ref, a side that does not render), or when the change leaves a stack
file that does not load: its problems, one line each as `kilonode validate` prints them,
and nothing written.
"""
diff.__doc__ = HELP
