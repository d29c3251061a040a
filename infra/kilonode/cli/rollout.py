"""`kilonode rollout`: move a pool's scale sets to their model (a new node image version, new
custom data) one fabric at a time, gang-aware, gated and resumable (kilonode.rollout).

The journal file is the rollout: `start` writes it, each `step` reads the cluster, decides,
carries the steps out and saves it; `run` steps until done or paused. Stop at any point and
`step` again: it goes on from the journal.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import StackArg, die, load_and_plan, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.config import Stack
    from kilonode.plan import ClusterPlan
    from kilonode.rollout.model import Action, ClusterState, Journal

rollout_app = typer.Typer(
    name="rollout",
    help=(
        "Roll a pool's scale sets into their model after `pulumi up` changed it (a new node image "
        "version, new custom data): the canary scale set first, then `--in-flight` at a time once it has "
        "soaked. Each scale set is cordoned, drained (PodDisruptionBudgets respected), upgraded and reimaged, "
        "then gated: its nodes booted again, Ready, past their GPU health checks, its pool's alerts quiet. "
        "The next --cordon-ahead scale sets are cordoned ahead so their gangs can finish; a scale set where a "
        "gang runs waits (up to --gang-wait, then the rollout pauses) unless --cut-gangs, which evicts each gang "
        "whole. A gate that does not pass pauses the rollout with the nodes cordoned. Start with `start`, then "
        "`step` (one step, --dry-run to see it) or `run`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JournalOpt = Annotated[Path | None, typer.Option(
    "--journal", metavar="PATH",
    help="The rollout's journal file (default .kilonode/rollout/<stack>.json in this directory).")]
StateOpt = Annotated[Path | None, typer.Option(
    "--state", metavar="FILE",
    help="Read the cluster from a recorded state (JSON, as --record writes it) instead of Azure and Kubernetes: "
    "a rehearsal, a test, a post-mortem.")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", help="Print the steps and why it waits; carry nothing out and leave the journal as it was.")]
RecordOpt = Annotated[Path | None, typer.Option(
    "--record", metavar="FILE", help="Also write the state read from the cluster to FILE (for --state).")]
SubscriptionOpt = Annotated[str | None, typer.Option(
    "--subscription", metavar="ID",
    help="The Azure subscription (default: the stack's azure-native:subscriptionId, else AZURE_SUBSCRIPTION_ID). "
    "Credentials: azure-identity's DefaultAzureCredential (az login, a managed identity, AZURE_* variables).")]
KubeconfigOpt = Annotated[str | None, typer.Option(
    "--kubeconfig", metavar="FILE", help="The cluster's kubeconfig (default KUBECONFIG or ~/.kube/config).")]
PrometheusOpt = Annotated[str | None, typer.Option(
    "--prometheus", metavar="URL",
    help="Prometheus' base URL for its alerts (default: the one `start` was given, else the cluster's Prometheus "
    "through the apiserver's service proxy, monitoring/prometheus). Unreachable: the alerts are unknown and no "
    "gate passes.")]

DURATION = re.compile(r"(\d+)([smhd]?)")


def seconds(text: str) -> int:
    """'30m' -> 1800; units s, m, h, d; a bare number is seconds."""
    match = DURATION.fullmatch(text.strip())
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration (like 90s, 30m, 2h)")
    return int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]


def journal_path(stack_ref: str, given: Path | None) -> Path:
    if given is not None:
        return given
    name = Path(stack_ref).name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")
    return Path(".kilonode") / "rollout" / f"{name}.json"


def _load_journal(path: Path) -> Journal:
    from kilonode.rollout import journal as journals

    if not path.exists():
        die(f"{path}: no rollout journal here; `kilonode rollout start STACK --pool POOL` writes it "
            "(or give --journal)", "kilonode rollout")
    try:
        return journals.load(path)
    except ValueError as error:
        die(str(error), "kilonode rollout")


@rollout_app.command("start")
def start(
    stack_ref: StackArg,
    pool: Annotated[str, typer.Option("--pool", metavar="POOL", help="The pool to roll (the stack's name for it).")],
    canary: Annotated[str | None, typer.Option(
        "--canary", metavar="SCALESET",
        help="The scale set that goes first, alone (default the pool's first).")] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="SCALESET", help="Roll only these scale sets of the pool (repeat it); default all.")] = None,
    in_flight: Annotated[int, typer.Option(
        "--in-flight", min=1, help="Scale sets in progress at once after the canary: each an InfiniBand fabric "
        "whose nodes leave the pool meanwhile.")] = 1,
    batch: Annotated[int, typer.Option(
        "--batch", min=1, help="Instances taken at once in a scale set without InfiniBand (a fabric is always "
        "taken whole).")] = 50,
    soak: Annotated[str, typer.Option(
        "--soak", metavar="DURATION", help="How long the canary must stay done before any other starts.")] = "30m",
    gate_timeout: Annotated[str, typer.Option(
        "--gate-timeout", metavar="DURATION",
        help="How long a scale set's upgrade and gate may take before it fails and the rollout pauses.")] = "60m",
    cut_gangs: Annotated[bool, typer.Option(
        "--cut-gangs", help="Take a scale set even where a gang's pods run, evicting each such gang whole, its pods "
        "on other fabrics too (a cross-fabric gang): in a maintenance window only. Without it such a scale set "
        "waits.")] = False,
    cordon_ahead: Annotated[int, typer.Option(
        "--cordon-ahead", min=0, metavar="N", help="Cordon the next N pending scale sets ahead of their turn, so no "
        "new pod lands there and their gangs can finish (0: none; a busy pool then may never free a fabric).")] = 1,
    steer: Annotated[bool, typer.Option(
        "--steer/--no-steer", help="Taint every node not yet rolled kilonode.io/rollout-pending:PreferNoSchedule, "
        "lifted once its batch passes its gate: gangs that start or restart meanwhile prefer the rolled fabrics, "
        "so one cut once is not placed where the rollout cuts it again. PreferNoSchedule only ranks those nodes "
        "last; it keeps no pod off them.")] = True,
    gang_wait: Annotated[str, typer.Option(
        "--gang-wait", metavar="DURATION", help="How long a scale set may wait for its gangs before the rollout "
        "pauses, naming which gangs hold which scale set.")] = "24h",
    hold: Annotated[str | None, typer.Option(
        "--hold", metavar="DURATION", help="How long a passing gate is held before it passes, so an alert can "
        "fire (default: the longest `for:` among the pool's alerts, 10m for a pool without them).")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", metavar="URL", help="Prometheus' base URL for the rollout's steps (kept in the journal). "
        "To roll the pool that runs the cluster's Prometheus (monitoring) with its gates reading alerts: a "
        "Prometheus outside the cluster that scrapes it, since the rollout evicts the cluster's own.")] = None,
    without_alerts: Annotated[bool, typer.Option(
        "--without-alerts", help="Only for the pool that runs the cluster's Prometheus (monitoring), which the "
        "rollout evicts: its gates read no alerts and wait instead, besides the node checks, for that Prometheus "
        "Ready again (its node uncordoned for it), held --hold. Alerting is dark meanwhile; Prometheus' "
        "history stays on its disk, which follows the pod (docs/monitoring.md, \"Storage\"). Recorded in the "
        "journal; refused on any other pool.")] = False,
    journal_file: JournalOpt = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Start again over an existing journal: the old one is kept beside it, renamed with the "
        "time (its progress, the gangs it cut, its log).")] = False,
) -> None:
    """Write a rollout's journal: the pool's scale sets in order (the canary first) and the policy.

    The target is the pool's image version in the plan (nodeImage.pools, else nodeImage.version):
    run it after `pulumi up` has put that version (or new custom data) in the scale sets' model.
    Nothing in the cluster changes until `step` or `run`. The canary defaults to the pool's first
    shared scale set (a team's reserved shard is not the one to try an image on).
    """
    from kilonode.rollout.model import Journal, Policy
    from kilonode.rollout.observe import hold_s

    stack, plan = load_and_plan(stack_ref)
    path = journal_path(stack_ref, journal_file)
    if path.exists() and not force:
        die(f"{path}: a rollout journal is already there; `kilonode rollout status {stack_ref}` shows it, "
            "--force starts again (the old one is kept beside it)", "kilonode rollout start")
    _alert_source(plan, pool, prometheus, without_alerts)
    if without_alerts:
        _alone(path, stack.name)
    order = _order(plan, pool, canary, only)
    policy = Policy(order=tuple(order), in_flight=in_flight, batch=batch, soak_s=seconds(soak),
                    gate_timeout_s=seconds(gate_timeout), cut_gangs=cut_gangs, cordon_ahead=cordon_ahead,
                    gang_wait_s=seconds(gang_wait), hold_s=seconds(hold) if hold else hold_s(plan, pool), steer=steer,
                    without_alerts=pool if without_alerts else "")
    journal = Journal(stack.name, f"{pool} image {plan.image_version_of(pool)}", policy, prometheus=prometheus or "")
    _write_new(journal, path, stack_ref)


def _write_new(journal: Journal, path: Path, stack_ref: str) -> None:
    """Save a new journal, an earlier one set aside beside it, under the journal's lock."""
    from kilonode.rollout import journal as journals
    from kilonode.rollout.model import dark_alerting

    now, order, pool = time.time(), journal.policy.order, journal.policy.without_alerts
    journal.log.append(f"{now:.0f} started: {journal.target}, {len(order)} scale sets, canary {order[0]}")
    if pool:
        journal.log.append(f"{now:.0f} --without-alerts: gates read no alerts, they wait for Prometheus Ready again; "
                           f"{dark_alerting(pool)}")
    with _holding(path):  # never set aside a journal a running `run` is writing
        if path.exists():
            aside = journals.set_aside(path, now)
            out.print(f"{path}: the earlier rollout's journal is kept as {aside}", markup=False)
        journals.pause_request(path).unlink(missing_ok=True)  # a pause left for the earlier rollout
        journals.save(journal, path)
    out.print(f"{path}: rollout of {journal.target} over {len(order)} scale sets, canary {order[0]}; "
              f"`kilonode rollout step {stack_ref} --dry-run` shows the first step", markup=False)
    if pool:
        out.print(f"--without-alerts: {dark_alerting(pool)}; its history stays on its disk (a claim that follows "
                  "the pod)", markup=False,
                  soft_wrap=True)


def _alert_source(plan: ClusterPlan, pool: str, prometheus: str | None, without_alerts: bool) -> None:
    """Refuse a start whose gates could read no alerts: the pool running the cluster's Prometheus needs
    --prometheus (another one) or --without-alerts, and only that pool may go without."""
    runs_prometheus = pool == _prometheus_pool(plan)
    if without_alerts and not runs_prometheus:
        die(f"--without-alerts is only for the pool that runs the cluster's Prometheus "
            f"({_prometheus_pool(plan) or 'none in this plan'}): pool {pool}'s gates read its alerts",
            "kilonode rollout start")
    if without_alerts and prometheus:
        die("give --prometheus URL (the gates read that Prometheus' alerts) or --without-alerts (they read none), "
            "not both", "kilonode rollout start")
    if runs_prometheus and not prometheus and not without_alerts:
        die(f"pool {pool} runs the cluster's Prometheus: rolling it evicts the Prometheus its gates read. Give "
            "--without-alerts (its gates wait for that Prometheus Ready again instead; alerting is dark while the "
            "pool rolls, its history kept on its claim), or --prometheus URL, a Prometheus outside the cluster that "
            "scrapes it (docs/operations.md, \"Rolling a node image\")", "kilonode rollout start")


def _alone(path: Path, stack: str) -> None:
    """Refuse a --without-alerts rollout while another rollout of the stack is not done (its journal
    beside this one): the Prometheus this one evicts is the one the other's gates read, and unknown
    alerts hold every gate (kilonode.rollout.decide) until it fails at its timeout, its fabric cordoned."""
    from kilonode.rollout import journal as journals

    busy = []
    for other in sorted(path.parent.glob(f"{stack}*.json")) if path.parent.is_dir() else []:
        if other == path or re.search(r"\.\d{8}T\d{6}Z(\.\d+)?\.json$", other.name):
            continue  # this one, or one set aside by start --force
        try:
            journal = journals.load(other)
        except (OSError, ValueError):
            continue
        if journal.stack == stack and any(journal.of(n).phase != "done" for n in journal.policy.order):
            busy.append(f"{other.name} ({journal.target})")
    if busy:
        die(f"--without-alerts evicts the Prometheus every other rollout's gates read, and {', '.join(busy)} is not "
            "done: its gates would wait on unknown alerts until they fail. Finish (or pause and finish) it first",
            "kilonode rollout start")


def _prometheus_pool(plan: ClusterPlan) -> str:
    """The pool the cluster's Prometheus runs on (its nodeSelector, kilonode.k8s.monitoring): the
    plan's choice (the pool marked monitoring, else the first system pool, else the first untainted
    one: docs/monitoring.md, "Placement"); '' where the plan places none."""
    if plan.prometheus is not None:
        return plan.prometheus.pool
    return next((p.name for p in plan.node_pools if p.monitoring), "")


def _dark(journal: Journal) -> str:
    """The line `status` and `step` print while a --without-alerts rollout is not done ('' otherwise)."""
    from kilonode.rollout.model import dark_alerting

    pool = journal.policy.without_alerts
    if not pool or all(journal.of(n).phase == "done" for n in journal.policy.order):
        return ""
    return (f"{dark_alerting(pool)} (started --without-alerts: its gates read no alerts, they wait for Prometheus "
            "Ready again)")


def _order(plan: ClusterPlan, pool: str, canary: str | None, only: list[str] | None) -> list[str]:
    """The pool's scale sets to roll, the canary first: the one named, else the first shared scale
    set (a team's reserved shard is its capacity, not the place to try an image first)."""
    from kilonode.rollout.observe import targets

    try:
        found = targets(plan, pool)
    except ValueError as error:
        die(str(error), "kilonode rollout start")
    names = [t.name for t in found]
    unknown = [n for n in [*(only or []), *([canary] if canary else [])] if n not in names]
    if unknown:
        die(f"pool {pool} has no scale set {', '.join(unknown)} (it has {names[0]} .. {names[-1]})",
            "kilonode rollout start")
    order = [n for n in names if not only or n in only]
    shared = [t.name for t in found if t.team is None and t.name in order]
    canary = canary or (shared[0] if shared else order[0])
    return [canary, *(n for n in order if n != canary)]


def _state(stack: Stack, plan: ClusterPlan, journal: Journal, state_file: Path | None, record: Path | None,
           sources: tuple[str | None, str | None, str | None]) -> ClusterState:
    """The cluster: from --state, or observed through the SDKs (and written to --record)."""
    from kilonode.rollout import observe

    if sources[2] and journal.policy.without_alerts:
        die(f"this rollout was started --without-alerts for pool {journal.policy.without_alerts}: its gates read no "
            "alerts. To gate on a Prometheus outside the cluster, `start --force --prometheus URL`",
            "kilonode rollout")
    if state_file is not None:
        try:
            return observe.state_from_json(state_file.read_text(encoding="utf-8"), str(state_file))
        except ValueError as error:
            die(str(error), "kilonode rollout")
    subscription, kubeconfig, prometheus = sources
    prometheus = prometheus or journal.prometheus or None
    subscription = (subscription or stack.provider_config.get("azure-native:subscriptionId")
                    or os.environ.get("AZURE_SUBSCRIPTION_ID"))
    if not subscription:
        die("no Azure subscription: give --subscription, set azure-native:subscriptionId in the stack or "
            "AZURE_SUBSCRIPTION_ID", "kilonode rollout")
    # the journal's scale sets, in its order, each with its pool (the plan's names)
    known = {t.name: t for p in plan.node_pools for t in observe.targets(plan, p.name)}
    wanted = [known[n] for n in journal.policy.order if n in known]
    state = observe.observe(plan, wanted, observe.Sources(subscription, kubeconfig, None, prometheus,
                                                          journal.policy.without_alerts))
    if record is not None:
        record.write_text(observe.state_to_json(state), encoding="utf-8")
    return state


def _say(actions: list[Action]) -> None:
    from kilonode.rollout.execute import describe

    for action in actions:
        prefix = {"wait": "waits:", "pause": "PAUSED:", "done": "done:"}.get(action.kind, "step:")
        out.print(f"  {prefix} {describe(action) if prefix == 'step:' else _why(action)}", markup=False)


def _why(action: Action) -> str:
    return f"{action.scale_set}: {action.why}" if action.scale_set else action.why


def _holding(path: Path) -> contextlib.AbstractContextManager[None]:
    """The journal's lock (kilonode.rollout.journal.locked), its refusal said as a CLI error."""
    from kilonode.rollout import journal as journals

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        try:
            with journals.locked(path):
                yield
        except journals.Busy as busy:
            die(str(busy), "kilonode rollout")

    return hold()


def _step_once(stack_ref: str, journal_file: Path | None, state_file: Path | None, dry_run: bool,
               record: Path | None, sources: tuple[str | None, str | None, str | None]) -> Journal:
    from kilonode.rollout import journal as journals
    from kilonode.rollout.decide import decide
    from kilonode.rollout.execute import CARRIED, Executor, compute_client, execute
    from kilonode.rollout.observe import kube_client

    stack, plan = load_and_plan(stack_ref)
    path = journal_path(stack_ref, journal_file)
    journal = _load_journal(path)
    if not dry_run and journals.take_pause_request(journal, path, time.time()):
        journals.save(journal, path)
    state = _state(stack, plan, journal, state_file, record, sources)
    now = time.time()
    dark = _dark(journal)  # before decide: the step that finishes the pool still says it
    actions = decide(journal, state, now)
    out.print(f"{journal.stack}: {journal.target}", markup=False)
    if dark:
        out.print(f"  NOTE: {dark}", markup=False, soft_wrap=True)
    _say(actions)
    if dry_run:
        out.print("dry run: nothing was carried out and the journal is as it was", markup=False)
        return _load_journal(path)
    if any(a.kind in CARRIED for a in actions):
        if state_file is not None:
            die("--state reads a recorded cluster: carrying its steps out needs the real one (add --dry-run)",
                "kilonode rollout step")
        subscription = sources[0] or stack.provider_config.get("azure-native:subscriptionId") or \
            os.environ.get("AZURE_SUBSCRIPTION_ID") or ""
        executor = Executor(kube_client(sources[1]), compute_client(subscription), plan.node_resource_group,
                            say=lambda line: out.print(line, markup=False))
        # saved before each action (what is in flight) and after it: a step that ends mid-action
        # (a drain, an Azure call of up to hours) is carried out again by the next, never taken as done
        execute(actions, journal, executor, now, save=lambda j: journals.save(j, path))
    journals.save(journal, path)
    if journal.paused:
        out.print(f"PAUSED: {journal.paused}", markup=False)
    return journal


@rollout_app.command("step")
def step(
    stack_ref: StackArg,
    journal_file: JournalOpt = None,
    state_file: StateOpt = None,
    dry_run: DryRunOpt = False,
    record: RecordOpt = None,
    subscription: SubscriptionOpt = None,
    kubeconfig: KubeconfigOpt = None,
    prometheus: PrometheusOpt = None,
) -> None:
    """Read the cluster, decide, carry the steps out once, save the journal; print what it did and why it waits.

    Exit 0 while the rollout goes on or is done, 1 when it is paused (a failed gate or step: the
    line says what to do), 2 when it could not run.
    """
    sources = (subscription, kubeconfig, prometheus)
    with contextlib.nullcontext() if dry_run else _holding(journal_path(stack_ref, journal_file)):
        journal = _step_once(stack_ref, journal_file, state_file, dry_run, record, sources)
    if journal.paused:
        raise typer.Exit(code=ExitCode.FAILED)


@rollout_app.command("run")
def run(
    stack_ref: StackArg,
    every: Annotated[int, typer.Option("--every", min=5, metavar="SECONDS", help="Seconds between steps.")] = 60,
    for_: Annotated[str, typer.Option(
        "--for", metavar="DURATION", help="Stop stepping after this long (the journal keeps the place).")] = "12h",
    journal_file: JournalOpt = None,
    subscription: SubscriptionOpt = None,
    kubeconfig: KubeconfigOpt = None,
    prometheus: PrometheusOpt = None,
) -> None:
    """`step` every --every seconds until the rollout is done or paused, or --for has passed.

    Exit 0 done, 1 paused, 3 still going when --for ran out (run it again to go on).
    """

    deadline = time.monotonic() + seconds(for_)
    with _holding(journal_path(stack_ref, journal_file)):  # the whole run: no `step` slips in between
        _run_until(stack_ref, journal_file, every, deadline, (subscription, kubeconfig, prometheus))


def _run_until(stack_ref: str, journal_file: Path | None, every: int, deadline: float,
               sources: tuple[str | None, str | None, str | None]) -> None:
    from kilonode.rollout.decide import BUSY

    while True:
        journal = _step_once(stack_ref, journal_file, None, False, None, sources)
        if journal.paused:
            raise typer.Exit(code=ExitCode.FAILED)
        if all(journal.of(n).phase == "done" for n in journal.policy.order):
            out.print(f"done: every scale set runs {journal.target}", markup=False)
            return
        if time.monotonic() + every > deadline:
            busy = [n for n in journal.policy.order if journal.of(n).phase in BUSY]
            out.print(f"--for ran out; in progress: {', '.join(busy) or 'none'}; `kilonode rollout run` goes on",
                      markup=False)
            raise typer.Exit(code=3)
        time.sleep(every)


@rollout_app.command("status")
def status(stack_ref: StackArg, journal_file: JournalOpt = None) -> None:
    """Print each scale set's phase, since when, and why it waits or failed."""
    path = journal_path(stack_ref, journal_file)
    journal = _load_journal(path)
    policy = journal.policy
    out.print(f"{path}: {journal.stack}: {journal.target}; canary {policy.order[0]}, in flight {policy.in_flight}, "
              f"soak {policy.soak_s} s, gate timeout {policy.gate_timeout_s} s, hold {policy.hold_s} s, "
              f"cordon ahead {policy.cordon_ahead}, gang wait {policy.gang_wait_s} s, "
              f"{'cuts' if policy.cut_gangs else 'does not cut'} gangs, "
              f"{'steers gangs to rolled fabrics' if policy.steer else 'does not steer'}"
              + (f", gates read no alerts for pool {policy.without_alerts} (--without-alerts: they wait for "
                 "Prometheus Ready again)" if policy.without_alerts else ""), markup=False, soft_wrap=True)
    dark = _dark(journal)
    if dark:
        out.print(f"  NOTE: {dark}", markup=False, soft_wrap=True)
    for name in policy.order:
        progress = journal.of(name)
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(progress.since)) if progress.since else "-"
        extra = f" ({progress.why})" if progress.why else ""
        cut = f"; gangs cut: {', '.join(progress.gangs_cut)}" if progress.gangs_cut else ""
        out.print(f"  {name}: {progress.phase} since {since}{extra}{cut}", markup=False)
    if journal.paused:
        out.print(f"PAUSED: {journal.paused}", markup=False)


@rollout_app.command("pause")
def pause(
    stack_ref: StackArg,
    why: Annotated[str, typer.Option("--why", help="Why it is paused: the next `step` prints it.")],
    journal_file: JournalOpt = None,
) -> None:
    """Pause the rollout: `step` and `run` take nothing more until `resume` (what is in progress stays as it is)."""
    from kilonode.rollout import journal as journals

    path = journal_path(stack_ref, journal_file)
    try:
        with journals.locked(path):
            journal = _load_journal(path)
            journal.paused = f"paused by the operator: {why}"
            journal.log.append(f"{time.time():.0f} paused: {why}")
            journals.save(journal, path)
            out.print(f"{path}: paused", markup=False)
    except journals.Busy as busy:
        # a `run` holds it: leave the request for its next step, which pauses before it takes anything
        journals.pause_request(path).write_text(why + "\n", encoding="utf-8")
        out.print(f"{busy}. Left the pause for it ({journals.pause_request(path).name}): it pauses at its next "
                  "step, before it takes anything more", markup=False)


@rollout_app.command("resume")
def resume(stack_ref: StackArg, journal_file: JournalOpt = None) -> None:
    """Clear the pause. A scale set that failed its gate gets its gate tried again; one whose
    drain or upgrade failed gets that step again."""
    from kilonode.rollout import journal as journals

    path = journal_path(stack_ref, journal_file)
    with _holding(path):
        journal = _load_journal(path)
        journals.take_pause_request(journal, path, time.time())  # one left for a run that has stopped
        said = journals.resume(journal, time.time())
        journals.save(journal, path)
    for line in said:
        out.print(f"  {line}", markup=False)
    if not said:
        out.print("nothing was paused or failed", markup=False)
