"""`kilonode upgrade STACK --to VERSION`: a Kubernetes minor upgrade as reviewable stack changes
(kilonode.rollout.minor), printed, written out, or applied one step at a time."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from kilonode.cli.common import StackArg, die, load_and_plan, out
from kilonode.yamlio import load_yaml


def upgrade(
    stack_ref: StackArg,
    to: Annotated[str, typer.Option("--to", metavar="VERSION", show_default=False,
                                    help="The Kubernetes version to reach: a patch release of the next minor "
                                         "(1.<minor + 1>.<patch>, one the binaries catalogue pins).")],
    canary: Annotated[str | None, typer.Option("--canary", metavar="POOL", show_default=False,
                                               help="The pool that moves first (default: the smallest work pool).")]
    = None,
    step: Annotated[str | None, typer.Option("--step", metavar="NAME", show_default=False,
                                             help="Apply this step's edits to the stack file as the last step "
                                                  "left it (comments kept, one atomic write) and check it still "
                                                  "loads. A step already applied changes nothing; one whose "
                                                  "turn has not come is refused.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", metavar="DIR", show_default=False,
                                                 help="Write each step's whole stack file (NN-<step>.yaml) and "
                                                      "PLAN.md there, to commit one by one.")] = None,
) -> None:
    """Plan a Kubernetes minor upgrade as a sequence of stack changes, each within the version
    skew policy, each reviewed with `kilonode diff` and applied with `pulumi up` on its own: pin
    the pools, move the control plane (apiservers one at a time, then the in-cluster components),
    then each pool through its own image and `kilonode rollout`, the canary first; then remove
    the pins and the previous images. Without --step or --out it prints the steps and checks
    that each one's stack loads. docs/operations.md, "Upgrading Kubernetes by one minor"."""
    from kilonode.config.load import CONFIG_KEY
    from kilonode.rollout.minor import apply, plan_upgrade, refusal
    from kilonode.yamlio import roundtrip_dump, roundtrip_yaml

    stack, cluster = load_and_plan(stack_ref)
    if not _is_version(to):
        die(f"--to {to!r}: give a version 1.<minor>.<patch>, the next minor after {stack.config.kubernetes_version}",
            "kilonode upgrade")
    if (why := refusal(stack.config, to)) is not None:
        die(why, "kilonode upgrade")
    if canary is not None and canary not in {p.name for p in stack.config.node_pools}:
        die(f"--canary {canary!r} is not a pool of {stack.name}", "kilonode upgrade")
    plan = plan_upgrade(stack.config, stack.name, to, canary)
    names = [s.name for s in plan.steps]
    if step is not None and step not in names:
        die(f"--step {step!r}: the steps are {', '.join(names)}", "kilonode upgrade")
    if plan.finished:
        # the cleanup ran (or the stack never went through kilonode upgrade): a step asked again
        # is already applied, not a downgrade from `to` to `to`
        out.print(f"{stack.name} runs Kubernetes {to} with no pool pinned: every step of the upgrade is applied"
                  + (f" (--step {step}: nothing changed)" if step is not None else ""), markup=False)
        return
    _check_remaining(stack, plan, to)
    if step is not None:
        number = names.index(step) + 1
        chosen = plan.steps[number - 1]
        following = plan.next
        if chosen.done:
            out.print(f"{stack.file}: step {number} ({chosen.name}) is already applied; nothing changed."
                      + (f" Next: --step {following.name}" if following is not None else ""), markup=False)
            return
        if (first := plan.first_unapplied_before(chosen)) is not None:
            die(f"--step {step}: step {names.index(first.name) + 1} ({first.name}) is not applied yet; it goes first",
                "kilonode upgrade")
        if chosen.waits is not None:
            die(f"--step {step}: {chosen.waits}", "kilonode upgrade")
        _check_rolled(stack, cluster, plan, chosen)
        document_yaml = roundtrip_yaml()
        document = document_yaml.load(stack.file.read_text(encoding="utf-8"))
        apply(document["config"][CONFIG_KEY], chosen.edits)
        text = roundtrip_dump(document_yaml, document)
        _check_and_write(stack.file, text, stack.name)
        after = [s for s in plan.steps if not s.done and s is not chosen]
        out.print("[green]✓[/] " + escape(f"{stack.file}: step {number} ({chosen.title}) applied. Then: "
                                           + "; ".join(chosen.then)
                                           + (f". Next step: --step {after[0].name}" if after
                                              else ". That was the last step.")))
        return
    lines = _plan_text(plan)
    if out_dir is not None:
        _write_out(out_dir, stack.file, plan, lines)
    out.print("\n".join(lines), markup=False)


def _check_rolled(stack: Any, cluster: Any, plan: Any, chosen: Any) -> None:
    """Refuse a step whose rollouts are not done: a pool step other than the canary's before the canary
    pool's rollout is done; the cleanup before every pool's is (it deletes what they run)."""
    canary = next((s for s in plan.steps if s.pool), None)
    if chosen.pool and canary is not None and chosen is not canary and (
            why := _rollout_unfinished(stack, cluster, canary.pool)):
        die(f"--step {chosen.name}: the canary pool goes first and alone: {why}. Finish its rollout, then the "
            "other pools (docs/operations.md, \"Upgrading Kubernetes by one minor\")", "kilonode upgrade")
    if chosen.name == "cleanup" and (unfinished := _unfinished_rollouts(stack, plan)):
        die(f"--step cleanup deletes every previous image version, the one a scale set not yet rolled still runs "
            f"and reimages to: {'; '.join(unfinished)}. Finish each pool's rollout (`kilonode rollout run`) and "
            "run this step again; a pool rolled another way: remove its `previous` by hand once `az vmss "
            "list-instances` shows every instance at the model", "kilonode upgrade")


def _unfinished_rollouts(stack: Any, plan: Any) -> list[str]:
    """Each pool whose rollout is not known done (the cleanup removes what those scale sets run)."""
    from kilonode.plan import checked_plan

    cluster = checked_plan(stack)
    found = [_rollout_unfinished(stack, cluster, step.pool) for step in plan.steps if step.pool]
    return [f for f in found if f]


def _rollout_unfinished(stack: Any, cluster: Any, name: str) -> str:
    """Why pool `name`'s rollout is not known done ('' when it is), read from the project the stack file
    is in. A pool's journal is the pool step's (`<stack>-<pool>.json`) or the default one (`<stack>.json`)
    where its target names that pool; it counts only when it covers every scale set of the pool (a
    `--only` rollout does not) at the pool's image version now, each done."""
    from kilonode.rollout import journal as journals

    root = stack.file.parent.parent if stack.file.parent.name == "stacks" else stack.file.parent
    pool = next(p for p in cluster.node_pools if p.name == name)
    target = f"{pool.name} image {cluster.image_version_of(pool.name)}"
    sets = {s.name for s in pool.shards}
    journal, why = None, f"no rollout journal of pool {pool.name} at {target} under {root / '.kilonode/rollout'}"
    for path in (root / f".kilonode/rollout/{stack.name}-{pool.name}.json",
                 root / f".kilonode/rollout/{stack.name}.json"):
        try:
            candidate = journals.load(path)
        except (OSError, ValueError):
            continue
        if candidate.target == target:
            journal = candidate
            break
        why = f"{path.name} rolls {candidate.target}, not {target}"
    if journal is None:
        return f"pool {pool.name}: {why}"
    missing = sorted(sets - set(journal.policy.order))
    left = [n for n in journal.policy.order if journal.of(n).phase != "done"]
    if missing:
        return (f"pool {pool.name}: {len(missing)} of its {len(sets)} scale sets not in its rollout "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if left:
        return (f"pool {pool.name}: {len(left)} of {len(journal.policy.order)} scale sets not done "
                f"({', '.join(left[:3])}{', ...' if len(left) > 3 else ''})")
    return ""


def _check_remaining(stack: Any, plan: Any, to: str) -> None:
    """Every step still to apply, cumulatively from the stack as it is, must load (validate would
    refuse it) and run only components whose contracts kilonode has read at the versions the step
    runs (preflight's contracts check breaks otherwise, and `pulumi up`'s gate refuses the run)."""
    from kilonode.config.load import stack_from_value
    from kilonode.plan import plan_stack
    from kilonode.preflight.checks.contracts import unread
    from kilonode.problems import StackError
    from kilonode.rollout.minor import apply

    raw: dict[str, Any] = copy.deepcopy(stack.raw)
    stale: dict[str, tuple[str, str | None]] = {}
    for number, each in enumerate(plan.steps, 1):
        if each.done:
            continue
        apply(raw, each.edits)
        try:
            step_plan = plan_stack(stack_from_value(stack.name, copy.deepcopy(raw), stack.file))
        except StackError as error:
            die(f"step {number} ({each.name}) would not load: {error}", "kilonode upgrade")
        for name, versions in unread(step_plan).items():
            stale.setdefault(name, versions)
    if stale:
        # the plan is still worth reading; no step is applied or written until the contracts are read
        out.print("\n".join(_plan_text(plan)), markup=False)
        listed = "; ".join(f"{name} (read at {was}, run at {now})" for name, (was, now) in sorted(stale.items()))
        die(f"kilonode has not read these components' contracts at the versions {to} runs: {listed}. Preflight "
            "would break at the step that first runs them and `pulumi up`'s gate refuse it, so no step is applied. "
            "Re-read each contract's lines at the new version (catalog/contracts.yaml, their sources) and add it to "
            "alsoReadAt, or take a kilonode release that has", "kilonode upgrade")


def _is_version(value: str) -> bool:
    parts = value.split(".")
    return len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] == "1"


def _plan_text(plan: Any) -> list[str]:
    lines = [f"# {plan.stack}: Kubernetes {plan.start} -> {plan.to}", ""]
    for number, step in enumerate(plan.steps, 1):
        state = "  [applied]" if step.done else (f"  [waits: {step.waits}]" if step.waits else "")
        lines.append(f"{number}. {step.title}  (--step {step.name}){state}")
        lines += [f"   - {_where(edit)}: {_value(edit)}" for edit in step.edits]
        lines += [f"   then: {command}" for command in step.then]
        lines.append(f"   kilonode diff should say: {step.review}")
        if step.rollback:
            journal = f"--journal .kilonode/rollout/{plan.stack}-{step.pool}.json" if step.pool else ""
            lines.append("   rollback (both keys in one change, then `kilonode diff`, `pulumi up` with the autoscaler "
                         f"paused, `kilonode rollout start {plan.stack} --pool {step.pool} {journal} --force` and "
                         f"`kilonode rollout run {plan.stack} {journal}`): "
                         + "; ".join(f"{_where(e)}: {_value(e)}" for e in step.rollback))
    lines += ["", *(f"Note: {note}" for note in plan.notes)]
    return lines


def _where(edit: Any) -> str:
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in edit.path).replace(".[", "[")


def _value(edit: Any) -> str:
    from kilonode.rollout.minor import DELETE

    return "remove" if edit.value is DELETE else f"{edit.value}"


def _check_and_write(file: Path, text: str, name: str) -> None:
    """Write the stack file only if the result loads (atomic: a temp file renamed over it)."""
    import os
    import tempfile

    from kilonode.config.load import CONFIG_KEY, stack_from_value
    from kilonode.problems import StackError

    try:
        stack_from_value(name, (load_yaml(text).get("config") or {}).get(CONFIG_KEY), file)
    except StackError as error:
        die(f"the step's stack would not load, so {file} was not changed: {error}", "kilonode upgrade")
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, file.stat().st_mode & 0o777)
    os.replace(tmp, file)


def _write_out(out_dir: Path, source: Path, plan: Any, lines: list[str]) -> None:
    from kilonode.config.load import CONFIG_KEY
    from kilonode.rollout.minor import apply
    from kilonode.yamlio import roundtrip_dump, roundtrip_yaml

    if out_dir.exists() and any(out_dir.iterdir()):
        die(f"{out_dir} exists and is not empty; choose a new folder", "kilonode upgrade")
    out_dir.mkdir(parents=True, exist_ok=True)
    document_yaml = roundtrip_yaml()
    document = document_yaml.load(source.read_text(encoding="utf-8"))
    for number, step in enumerate(plan.steps, 1):
        if step.done:  # already in the stack file: applying it again would undo later steps (the pins)
            continue
        apply(document["config"][CONFIG_KEY], step.edits)
        (out_dir / f"{number:02d}-{step.name}.yaml").write_text(roundtrip_dump(document_yaml, document),
                                                               encoding="utf-8")
    (out_dir / "PLAN.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.print(f"wrote {sum(not s.done for s in plan.steps)} stack files and PLAN.md to {out_dir}", markup=False)
