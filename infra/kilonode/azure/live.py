"""What `pulumi up` must read from Azure before it writes: the sizes of the autoscaled scale sets.

An autoscaled scale set's size is the cluster autoscaler's, and every update of the scale set (a
new image or custom data: each rollout's first step) is a PUT whose sku.capacity becomes its size
(kilonode.azure.node_pool._capacity says why ignoreChanges cannot keep it). So the program reads the
pools' scale sets once, at its start, and gives each autoscaled one its own size back. Read with the
deployer's `az` (as kilonode.azure.deployer and require_vhds do), as the signed-in identity.

It fails closed: a read that does not answer (no login, a throttled call) stops `pulumi up` before it
creates or changes anything, rather than writing sizes it does not know. A resource group not there
yet (the first `pulumi up`) has no scale set to keep.

What it cannot close: the autoscaler changing a size between this read and the scale set's update
later in the same run. docs/azure.md says to pause the autoscaler for a run that changes autoscaled
scale sets' models, and `kilonode diff` says when a change does (autoscaled-model-update).
"""

from __future__ import annotations

import json

from kilonode.azure.deployer import Runner, run_tool
from kilonode.plan import ClusterPlan


class LiveReadError(RuntimeError):
    """The scale sets' sizes could not be read: nothing may be written in their place."""


def live_capacities(plan: ClusterPlan, run: Runner = run_tool) -> dict[str, int]:
    """scale set name -> its sku.capacity in Azure now, for every scale set in the pools' group."""
    answer = run(["az", "vmss", "list", "--resource-group", plan.node_resource_group,
                  "--query", "[].{name: name, capacity: sku.capacity}", "--output", "json"])
    if answer.returncode != 0:
        if "ResourceGroupNotFound" in answer.stderr:
            return {}  # nothing deployed yet: every scale set is created at the plan's size
        raise LiveReadError(
            f"could not read the scale sets of resource group {plan.node_resource_group} "
            f"(`az vmss list` exit {answer.returncode}: {answer.stderr.strip()[:300]}); an update of an autoscaled "
            "scale set would otherwise write a size it does not know over the autoscaler's, so nothing was created "
            "or changed. Sign in (`az login`) and run `pulumi up` again")
    try:
        rows = json.loads(answer.stdout or "[]")
        return {str(row["name"]): int(row["capacity"]) for row in rows if row.get("capacity") is not None}
    except (ValueError, TypeError, KeyError) as error:
        raise LiveReadError(f"`az vmss list` answered what is not a list of scale sets ({error}); nothing was "
                            "created or changed") from None
