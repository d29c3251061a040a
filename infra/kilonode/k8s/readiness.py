"""ApiserverReady: `pulumi up` waits until the apiserver answers /readyz through the load
balancer before it creates any in-cluster object.

A real check, not a sleep: a `command:local:Command` that runs kubectl against the
endpoint with the program's own credentials, every 10 s, up to a bounded deadline, and
fails the update naming the endpoint if the apiserver never answers. It runs where
`pulumi up` runs, through the endpoint the stack's `deployer` gives it (the public frontend
admitted from the deployer's addresses, or the internal load balancer over a peering;
docs/azure.md, "How `pulumi up` reaches the apiserver"); `kilonode preflight`'s
deployer-path check traces that path through the graph before anything is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_command import local

from kilonode.plan import defaults

# The kubeconfig arrives in an environment variable (a secret: never on a command line,
# never in a file that outlives the check).
SCRIPT = """set -eu
kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"' EXIT
printf '%s' "$KILONODE_KUBECONFIG" > "$kubeconfig"
deadline=$(( $(date +%s) + KILONODE_TIMEOUT_S ))
until kubectl --kubeconfig "$kubeconfig" --request-timeout=10s get --raw=/readyz >/dev/null 2>&1; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "kube-apiserver at $KILONODE_ENDPOINT did not answer /readyz within $KILONODE_TIMEOUT_S s" >&2
    exit 1
  fi
  sleep "$KILONODE_INTERVAL_S"
done
echo "kube-apiserver at $KILONODE_ENDPOINT is ready"
"""


@dataclass(frozen=True)
class ApiserverReadyArgs:
    # https://<load balancer IP>:6443: the internal one (from the plan) or, for a deployer on the
    # internet, the public frontend's (Azure's address, known once it exists)
    endpoint: pulumi.Input[str]
    kubeconfig: pulumi.Output[str]  # secret
    # What must exist before asking, as outputs (the load balancers' IDs, the apiservers' image's,
    # the deployer's peerings'): the check waits for those resources alone. Outputs, never a resource to
    # depend on: a component there would stand for all its children (pulumi/pulumi#7732), and
    # a single apiserver VM among them would tie every in-cluster object to that VM, so
    # replacing it one at a time would take them all along (docs/azure.md, "Rolling the
    # control plane"). The VMs themselves are not waited for: the check asks until its deadline
    # (which so also covers their creation, minutes), and the load balancer serves whichever
    # apiserver answers.
    after: Sequence[pulumi.Input[str]] = ()
    timeout_s: int = defaults.APISERVER_READY_TIMEOUT_S
    interval_s: int = 10  # between two asks; a first boot takes minutes, so no need to hurry


class ApiserverReady(pulumi.ComponentResource):
    command: local.Command

    def __init__(self, name: str, args: ApiserverReadyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ApiserverReady", name, None, opts)
        self.command = local.Command(
            f"{name}-readyz",
            create=SCRIPT,
            interpreter=["/bin/sh", "-c"],
            environment={
                "KILONODE_KUBECONFIG": args.kubeconfig,
                "KILONODE_ENDPOINT": args.endpoint,
                "KILONODE_TIMEOUT_S": str(args.timeout_s),
                "KILONODE_INTERVAL_S": str(args.interval_s),
            },
            # Checked again whenever the endpoint moves (a new load balancer address), or what it
            # needs is replaced (a new load balancer, peering or apiserver image: the next full
            # `pulumi up` after a roll asks once more).
            triggers=[args.endpoint, *args.after],
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["stdout", "stderr"]),
        )
        self.register_outputs({})
