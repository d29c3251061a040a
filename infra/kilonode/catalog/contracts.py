"""Component contracts (contracts.yaml): what each third-party program the cluster runs needs
from its node and cluster, read at the pinned version, each requirement with its source; and
the kernel options of the kernels the images install (kernels.yaml), measured from Debian's
packages. Read by kilonode.preflight.checks.contracts, which evaluates each requirement by its
`kind` and never restates one."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load

# The kinds preflight knows how to evaluate (docs/contracts.md says how each is judged).
Kind = Literal[
    "deviceAccessFromImageEnv",  # a container relies on an env var of its image for device injection
    "waitsForNodeMarker",  # a workload must start only after a node unit wrote a marker file
    "hostNetworkOnIpBoundNodes",  # a node agent that needs no pod IP must not take one
    "devCharLinks",  # the NVIDIA /dev/char links, made on the host once the driver is loaded
    "kernelOptionForSelector",  # a device selector that works only with a kernel option and module
    "gpuDirectPath",  # GPU memory registered with the HCA (GPUDirect RDMA) on InfiniBand pools
    "ncclJobEnvironment",  # the generated NCCL job's environment on some sizes while the image's NCCL is older
    "heldForRescan",  # a component rescans its devices, and a node program holds a node one rescan
    "waitsForFabricState",  # a node program that must wait for NVSwitch fabric registration
    "renderedSetting",  # a node program's rendered JSON configuration sets a key on the pools it names
    "nodeSysctls",  # the pools' rendered sysctl.d file sets each kernel tunable a node program checks
    "cgroupV2",  # the pools boot the unified cgroup hierarchy, or the kubelet's config lets it run on v1
    "cgroupDriverMatchesKubelet",  # the kubelet's cgroupDriver equals every runtime handler's, where in effect
    "podNeeds",  # what a workload's pod spec must hold as upstream runs it: host network, args, capabilities
    "rbacAllows",  # what a workload's ServiceAccount must be allowed (verbs on resources, where)
    "discoveryRbac",  # the RBAC a service-discovery config needs for each discovery role it names
    "configMapSetting",  # a setting of a configuration file a ConfigMap holds (and the workload reads it)
    "crdPresent",  # CustomResourceDefinitions a workload watches, installed and serving a version
    "corefilePlugins",  # a Corefile's directives: compiled into the image, and serving what the probes ask
    "kernelAtLeast",  # a kernel release floor on every pool's image, when a setting asks for it
    "azureRoleOnNodeGroups",  # an autoscaler's node groups: in its resource group, its identity may write them
    "azureRoleForDisks",  # a CSI controller's identity: on its pools, disks in its group, attach where its plugin runs
    "apiserverFlags",  # the apiservers run with flags a component needs, the files they name delivered
    "servedToApiservers",  # the apiservers reach a workload's pods on a port (the pools' NSGs, its NetworkPolicies)
    "servedToPods",  # every pod reaches a workload's pods on its ports (the NetworkPolicies)
    "servedToPools",  # every pool's nodes reach a host-network workload's port (the pools' NSGs)
]


class Requirement(Row):
    id: str = Field(pattern=r"^[a-z0-9-]+$")
    kind: Kind
    what: str  # the requirement, as a finding says it
    value: dict[str, Any]  # what the evaluator reads (names, paths, options, minimum versions)
    source: list[str] = Field(min_length=1)  # owner/repo@tag:path:line, or a vendor document
    breaks: str  # what a cluster that does not meet it shows


class Contract(Row):
    component: str
    version: str  # the version the contract was read at
    # other releases every line was read at too (a component pinned per Kubernetes minor)
    also_read_at: list[str] = Field(default_factory=list)
    # where that version is pinned: a components.yaml key, `recipe:<package>`,
    # `binaries:<component>` (node-image/binaries.toml), or `kilonode`
    pin: str
    requirements: list[Requirement] = Field(min_length=1)


class Contracts(Row):
    contracts: dict[str, Contract]


class Kernel(Row):
    release: str
    debian_version: str
    options: dict[str, Literal["y", "m"]]
    unset: list[str]
    source: str

    def option(self, name: str) -> str | None:
        """y, m or None (not set)."""
        return self.options.get(name)


class Kernels(Row):
    kernels: dict[str, Kernel]


@cache
def contracts() -> dict[str, Contract]:
    return load(Contracts, CATALOG_DIR / "contracts.yaml").contracts


@cache
def kernels() -> dict[str, Kernel]:
    return load(Kernels, CATALOG_DIR / "kernels.yaml").kernels


def requirements(kind: str) -> list[tuple[str, Contract, Requirement]]:
    """Every requirement of a kind, with its contract's name and contract."""
    return [(name, c, r) for name, c in contracts().items() for r in c.requirements if r.kind == kind]
