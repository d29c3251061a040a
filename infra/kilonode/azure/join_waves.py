"""The timers that start the plan's waves of scale sets one interval apart (plan.components.joins).

One `command:local:Command` per wave after the first (`<cluster>-join-wave-NNN`, under the
cluster's JoinWaves component `<cluster>-join`), run where `pulumi up` runs: timer k
sleeps the plan's gap after timer k-1 (dependsOn), and wave k's scale sets dependsOn timer k,
so a wave starts its gap after the one before *started*, not after Azure has created it
(kilonode.plan.resolve.joins says why). The first timer waits for what every scale set's inputs
come from (network, identity, credentials, node images): it starts when the first wave can.

What pulumi-command 1.2.1 does with them (its Python SDK, pulumi_command/local/command.py):
- `create` runs "once on resource creation" and "will not be executed if the resource has
  already been created and its inputs are unchanged": a later `pulumi up` does not sleep again.
- "If an `update` command isn't provided, then `create` will also be run when the resource's
  inputs are modified": the timers give a no-op `update`, so a changed gap (the waves packed
  anew after growth) does not sleep again either; the waves it paced exist already.
- The SDK adds `replace_on_changes=["triggers[*]"]` to every Command (Command._internal_init);
  the timers have no triggers, no `delete` and no deleteBeforeReplace, so nothing replaces one,
  and removing one (fewer waves) runs nothing.
A timer is no input of any scale set: dependsOn orders operations and is not compared, so a
timer created, updated or removed never updates or replaces a scale set (no scale set sets
deleteBeforeReplace or replaceOnChanges: kilonode.azure.node_pool).
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
from pulumi_command import local

from kilonode.plan.model import JoinPlan

# In every timer's name: `kilonode plan` prints a scale set's timer on its `after:` line.
TIMER_MARK = "-join-wave-"
# A timer's update changes nothing and takes no time (see the module docstring).
NO_OP = "true"


def timer_name(name: str, wave: int) -> str:
    """Wave `wave`'s timer, named from the cluster's JoinWaves component (`<cluster>-join`)."""
    return f"{name}{TIMER_MARK}{wave:03d}"


class JoinWaves(pulumi.ComponentResource):
    """The timers of one cluster's waves; `after` says what each wave's scale sets wait for."""

    chain: list[local.Command | None]  # wave index -> its timer (None for the first wave)

    def __init__(self, name: str, joins: JoinPlan, gate: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:JoinWaves", f"{name}-join", None, opts)
        self._joins = joins
        self.chain = [None]
        previous: Sequence[pulumi.Resource] = gate
        for wave, gap_s in enumerate(joins.wave_gaps_s, start=1):
            timer = local.Command(
                timer_name(name, wave),
                create=f"sleep {gap_s}",
                update=NO_OP,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(previous)),
            )
            self.chain.append(timer)
            previous = [timer]
        self.register_outputs({})

    def after(self, wave: int, created: Sequence[Sequence[pulumi.Resource]]) -> list[pulumi.Resource]:
        """What wave `wave`'s scale sets wait for: their timer, and every scale set of the wave
        in_flight_waves before (`created`: the scale sets of the waves so far, wave by wave), so
        the waves k, k + in_flight_waves, ... are created one after the other."""
        timer, flight = self.chain[wave], self._joins.in_flight_waves
        earlier = created[wave - flight] if wave >= flight else []
        return [*([timer] if timer is not None else []), *earlier]
