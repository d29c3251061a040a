"""contracts: every third-party component's contract (catalog/contracts.yaml) against what the
cluster will really have.

A contract lists what a component needs from its node and cluster, each line read in its source
at the pinned version. This check evaluates every requirement by its `kind`, reading the
requirement's own `value` (the workload, the capability, the kernel option, the marker, the
minimum version): the code below knows how to judge a kind, never what a component needs. What it
judges against:

- the recorded graph: the workloads' pod specs (security contexts, init containers, volumes,
  host network, command lines), the ConfigMaps they read (the RDMA plugin's, kube-proxy's, the
  Corefile, azure.json, prometheus.yml, the gang scheduler's), RBAC, CRDs, the scale sets and the
  role assignments of Azure;
- the render: each GPU pool host's kubelet configuration (its cgroup driver), every pool host's CNI
  conflist;
- what the pool's image carries: the recipe (kilonode.image.recipe: its packages, its kernel and
  the overlays' modules-load.d) and what the build writes (kilonode.image.gpu: the toolkit's
  settings, the device unit); with `--images`, the built manifest instead where it records it;
- the kernels' options (catalog/kernels.yaml, measured from Debian's packages).

A contract whose `version` is not the version pinned where its `pin` says was read at another
release: a break, since none of its lines can be trusted until someone reads them again.

The kinds, each judged by one function below: deviceAccessFromImageEnv (a container that gets
its devices through its image's env var: privileged, the capability added, or the image's
toolkit taking the variable from anyone), waitsForNodeMarker (an init container waiting for a
marker a unit of the image writes), hostNetworkOnIpBoundNodes, devCharLinks (where the runtime runs
the GPU containers with the named cgroup driver, the image runs the named command in the named unit),
kernelOptionForSelector (a selector the component's config uses, the kernel option in the pool's
kernel, a module option loaded at boot), gpuDirectPath (the driver module, kernel options, the job
image's rdma-core and NCCL), ncclJobEnvironment (while the job image's NCCL is older than a release,
the environment of the NCCL job generated for the named topology families' pools), heldForRescan (a
ConfigMap's rescan interval above 0, and a node program's rendered hold at least that long on the
pools named), waitsForFabricState
(the agent's fabric wait on NVSwitch pools),
renderedSetting (a node program's rendered JSON setting, a dotted path, on the pools named), nodeSysctls
(the pools' rendered sysctl.d file sets each kernel tunable to the value), cgroupV2 (no parameter of
the image's kernel command line, the built manifest's or the recipe's, asks systemd for the legacy
cgroup hierarchy, unless the pool's rendered kubelet config sets the key to false),
cgroupDriverMatchesKubelet (on the pools of the named runtime, the kubelet's cgroupDriver equals every
runtime handler's: a break where the runtime does not report its driver to the kubelet, which then
runs with its own field; a warning where it does, the field being inert), podNeeds
(a workload's pod spec as upstream's manifest runs it: host network, container arguments, privileged,
capabilities in the bounding set, host paths and the propagation of their mounts), rbacAllows
(the workload's pods get a token and its
ServiceAccount is granted each request: ClusterRoleBindings anywhere, RoleBindings in their namespace,
the apiserver's own roles from catalog/rbac.yaml; a request that a bound role not readable here might
grant is a warning), discoveryRbac (each Kubernetes service-discovery block of a configuration a
ConfigMap holds: the resources its role lists and watches, in the namespaces it names),
configMapSetting (a ConfigMap's configuration file sets each path, holds no field a strict decoder
does not know, and the workload is started with that very file: its flag names a mount of the
ConfigMap's key), crdPresent (the CRDs a workload
watches, serving the version), corefilePlugins (a Corefile names only plugins built into the image,
and enables those serving what the container's probes ask), kernelAtLeast (where a ConfigMap's
setting asks for it, every pool's image kernel at or above a release), azureRoleOnNodeGroups (each
node group a `--nodes` flag names is a scale set of the resource group the Azure configuration lists,
and the identity it names holds a role with write on a scope containing it), azureRoleForDisks (the
identity a CSI controller's azure.json names is on the scale sets of the pools it runs on, may make
disks in that configuration's resource group and write the instances of every scale set its node
plugin runs on; that write elsewhere is a warning), apiserverFlags (every
apiserver's rendered unit runs with the flags, at the values given, and receives each file they name:
rendered, or in kilonode.plan.pki's layout for that host; not judged on a host that runs the line's
`unlessUnit`), servedToApiservers (the container serves the port, and the NSGs in front of every pool
its pods may land on, by the scheduling check's placement, admit the control-plane subnet on it). A
line's `onlyAt` keeps it to those of the releases the contract was read at.

Seeded breaks (tests/preflight/test_contracts.py), one per requirement used: the plugin without
SYS_ADMIN (and with the toolkit's env-var key true, the case that passes); no init container
waiting for the marker, and an image unit that writes another; the plugin off the host network;
the links unit missing from the image (and the runtime's cgroupfs driver, where the line does not apply,
while the kubelet's field alone does not stop it); the kubelet on cgroupfs with containerd's runc handlers
on systemd, and the reverse (a warning only on Docker pools, where cri-dockerd reports Docker's driver);
a link-type selector on the cloud kernel, ib_ipoib not loaded at boot, and a selector that needs
no netdev (not judged); the proprietary module on an InfiniBand pool, an NCCL older than DMA-BUF
and a job image's old rdma-core (an unrecorded one is a warning); an agent told not to wait for
the fabric; an InfiniBand pool whose agent does not probe GPUDirect; the cloud provider's
workloads off the host network, and its controller configuring cloud routes under Azure CNI; kube-proxy
told another pod interface prefix (or given another file than its ConfigMap's), a conflist in bridge
mode; a pool's sysctl file with a kernel tunable the kubelet checks at another value, or without it;
kube-proxy unprivileged, without the xtables lock, on a kernel older than nftables mode allows
(and in iptables mode, where that does not apply), unbound from system:node-proxier; CoreDNS without
its EndpointSlice reads, without NET_BIND_SERVICE, with a plugin its image lacks or without `ready`;
the autoscaler without its status ConfigMap or VolumeAttachment reads (not judged at a release whose
manifest lacks them), off the host network, with another VM type, no resource group or another
--cloud-config, a node group in another resource group or without its identity's role; Prometheus
without a discovery Role's EndpointSlices, without nodes/metrics; the gang scheduler without the
PodGroup CRD, with a v1beta3 configuration, with Coscheduling arguments the pinned release does not
decode (podGroupRejectPercentage before v0.34), its controller without pod reads, its scheduler's Lease
renamed (a warning: system:kube-scheduler is bound and not readable here); metrics-server without
nodes/metrics, unbound from the apiserver's auth-reader Role or auth-delegator ClusterRole (a binding to
a Role the apiserver does not create is a warning), an apiserver without a front-proxy flag, with
another request header, naming a CA file it does not receive, or without --enable-aggregator-routing
(not asked where the host runs kube-proxy), the pools' NSG closed to the control plane on its port, its
container serving another port; a stale contract version (and one read at every minor it names, which
holds for each).
Also seeded: an H100 job without NCCL_NVLS_ENABLE=0 or NCCL_NET_FORCE_FLUSH=0 under NCCL 2.18.3, and
neither judged once the image's NCCL has the fix; the RDMA plugin without rescans, and an InfiniBand GPU
node's agent holding it shorter than one rescan.
Held out, in a built image's manifest only (--images): a kernel without IPoIB, no devices unit, a
lenient toolkit, the proprietary module, no ib_ipoib at boot, an old rdma-core.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import yaml

from kilonode.catalog import binaries as catalog_binaries
from kilonode.catalog import components as catalog_components
from kilonode.catalog.contracts import Contract, Requirement, contracts, kernels
from kilonode.catalog.rbac import builtin_rbac
from kilonode.image import gpu as image_gpu
from kilonode.image.recipe import Recipe, load_recipe
from kilonode.k8s import nccl_job
from kilonode.plan import pki, wellknown
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.preflight import apiload, netpol
from kilonode.preflight.checks import identities, pod_isolation, scheduling
from kilonode.preflight.checks.deployer_path import NetworkGraph, admits
from kilonode.preflight.checks.scrape_path import nsgs_of
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import bootstrap_nodes, flags_of, unit_exec_args
from kilonode.yamlio import load_yaml

NAME = "contracts"
TITLE = ("Component contracts: what each component needs from its node and cluster, read at the pinned "
         "version, against the plan, render, graph and images")

Evaluator = Callable[[Inputs, str, Contract, Requirement], list[Finding]]


@cache
def _recipe() -> Recipe:
    return load_recipe()


def check(inputs: Inputs) -> list[Finding]:
    findings: list[Finding] = []
    unread_here = unread(inputs.plan)  # once for every contract: each lookup reads every contract's pin
    for name, contract in contracts().items():
        stale = _stale(unread_here, name, contract)
        if stale:
            findings.append(stale)
            continue
        pinned = pinned_version(contract.pin, inputs.plan.kubernetes_version)
        for requirement in contract.requirements:
            # a line read at some of the releases the contract names only (`onlyAt`) holds for those
            if "onlyAt" in requirement.value and pinned not in requirement.value["onlyAt"]:
                continue
            findings += EVALUATORS[requirement.kind](inputs, name, contract, requirement)
    return findings


def _finding(name: str, contract: Contract, req: Requirement, where: str, here: str, fix: str,
             level: str = "break", breaks: str | None = None) -> Finding:
    """What the finding says: the component and line, what violates it here, what breaks (the
    line's own `breaks`, or what the evaluator found breaks in this case), the sources."""
    return Finding(
        NAME, level, where,  # type: ignore[arg-type]  # "break" or "warn"
        f"{contract.component} {contract.version}, contract line {name}/{req.id}: {here}. {breaks or req.breaks}. "
        f"The contract: {req.what} (source: {req.source[0]}"
        + (f"; {len(req.source) - 1} more in catalog/contracts.yaml {name}/{req.id})" if len(req.source) > 1 else ")"),
        fix,
    )


# --- the contract's version against its pin -----------------------------------------------------


def pinned_version(pin: str, kubernetes_version: str) -> str | None:
    """The version pinned where `pin` says: a components.yaml key, `recipe:<package>` (the exact
    version the recipe declares for any image), `binaries:<component>` (a fixed version of
    node-image/binaries.toml), or `kilonode` (our own program: always current)."""
    if pin == "kilonode":
        return "kilonode"
    if pin.startswith("binaries:"):
        component = catalog_binaries.load().components.get(pin.removeprefix("binaries:"))
        if component is not None and component.follows == "kubernetes":
            return f"v{kubernetes_version}"  # the kubelet: the cluster's own release
        return str(component.version) if component is not None and component.version is not None else None
    if pin.startswith("recipe:"):
        package = pin.removeprefix("recipe:")
        recipe = _recipe()
        for extras in (("gpu", "infiniband"), ("gpu",)):
            declared = recipe.declared_packages("docker", extras).get(package)
            if declared is not None:
                return declared.version
        return None
    component = getattr(catalog_components.components(), _snake(pin), None)
    return component.release(pin, kubernetes_version) if component is not None else None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _versions_run(plan: ClusterPlan, pin: str) -> list[str | None]:
    """Every version of the pinned component the cluster runs: a binary that follows Kubernetes
    (the kubelet) at each pool's own version (nodePools[].kubernetesVersion: a minor upgrade moves
    the pools after the control plane), anything else at the one version the plan pins."""
    if pin.startswith("binaries:"):
        component = catalog_binaries.load().components.get(pin.removeprefix("binaries:"))
        if component is not None and component.follows == "kubernetes" and plan.node_pools:
            versions = sorted({p.kubernetes_version or plan.kubernetes_version for p in plan.node_pools})
            return [pinned_version(pin, v) for v in versions]
    return [pinned_version(pin, plan.kubernetes_version)]


def unread(plan: ClusterPlan) -> dict[str, tuple[str, str | None]]:
    """Contract name -> (the version it was read at, a version the plan runs it at that it was not
    read at): what `kilonode upgrade` must have re-read before a step may run."""
    found = {}
    for name, contract in contracts().items():
        read = {contract.version, *contract.also_read_at}
        missing = [v for v in _versions_run(plan, contract.pin)
                   if v not in read and not (v is None and contract.pin.startswith("recipe:"))]
        if missing:
            found[name] = (contract.version, missing[0])
    return found


def _stale(unread_here: Mapping[str, tuple[str, str | None]], name: str, contract: Contract) -> Finding | None:
    stale = unread_here.get(name)
    if stale is None:
        # (a package no image declares: its requirements say what is missing, line by line)
        return None
    pinned = stale[1]
    return Finding(
        NAME, "break", f"catalog/contracts.yaml {name}",
        f"the {contract.component} contract was read at {contract.version}, but {contract.pin} pins "
        f"{pinned or 'nothing'}: none of its lines is known to hold for what the cluster runs",
        f"read each line of the contract again at {pinned or 'the pinned version'} (its sources), update them and "
        f"its version, or pin {contract.version} again",
    )


# --- graph helpers -------------------------------------------------------------------------------


def _workload(inputs: Inputs, named: str) -> Resource | None:
    """A Kubernetes object of the graph by "Kind namespace/name"."""
    kind, _, ref = named.partition(" ")
    namespace, _, name = ref.rpartition("/")
    for r in inputs.resources:
        meta = r.inputs.get("metadata") or {}
        if r.is_kubernetes and r.kind == kind and meta.get("name") == name \
                and (meta.get("namespace") or "") == namespace:
            return r
    return None


def _pod_spec(workload: Resource) -> Mapping[str, Any]:
    return ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}


def _gpu_pools(inputs: Inputs) -> list[NodePoolPlan]:
    return [p for p in inputs.plan.node_pools if p.gpus_per_node > 0]


def _manifest(inputs: Inputs, pool: NodePoolPlan) -> Mapping[str, Any] | None:
    return next((m for m in (inputs.images or {}).values() if m.get("pool") == pool.name), None)


def _capabilities(container: Mapping[str, Any]) -> tuple[bool, set[str]]:
    """(privileged, the capabilities added), names without CAP_."""
    context = container.get("securityContext") or {}
    added = {str(c).upper().removeprefix("CAP_") for c in (context.get("capabilities") or {}).get("add") or []}
    return bool(context.get("privileged")), added


# --- the evaluators, one per kind ------------------------------------------------------------------


def _device_access_from_image_env(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """A container that gets its devices through an env var of its own image: the toolkit takes the
    variable from it only when privileged (the capability in its bounding set) or when the toolkit's
    key lets unprivileged containers set it."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if not _gpu_pools(inputs) or workload is None:
        return []  # no GPU pools, or no plugin (gpu-runtime says so)
    containers = [c for c in _pod_spec(workload).get("containers") or [] if c.get("name") == value["container"]]
    if not containers:
        return [_finding(name, contract, req, value["workload"], f"it has no container {value['container']}",
                         "keep the component's container name as upstream names it (kilonode.k8s.gpu)")]
    privileged, added = _capabilities(containers[0])
    if privileged or value["capability"] in added:
        return []
    findings = []
    for pool in _gpu_pools(inputs):
        settings, whose = _toolkit_settings(inputs, pool)
        if settings.get(value["toolkitKey"]) is True:
            continue
        findings.append(_finding(
            name, contract, req, f"{value['workload']} container {value['container']} on {pool.role()}",
            f"the container is not privileged and adds no {value['capability']}, and {whose}'s toolkit config "
            f"({image_gpu.TOOLKIT_CONFIG}) leaves {value['toolkitKey']} false: its image's {value['imageEnv']} is "
            "ignored",
            f"add {value['capability']} to the container's capabilities, as upstream's chart does (kilonode.k8s.gpu)"))
    return findings


def _toolkit_settings(inputs: Inputs, pool: NodePoolPlan) -> tuple[dict[str, Any], str]:
    """The toolkit configuration the pool's image has, over the toolkit's defaults: the built
    manifest's with --images where it records one, else what the image build writes."""
    manifest = _manifest(inputs, pool)
    recorded = (((manifest or {}).get("gpu") or {}).get("container_toolkit") or {}).get("settings")
    if manifest is not None and recorded is not None:
        return {**wellknown.TOOLKIT_DEFAULTS, **recorded}, f"the built image {manifest.get('name')}"
    return {**wellknown.TOOLKIT_DEFAULTS, **image_gpu.TOOLKIT_SETTINGS}, "the image build"


def _waits_for_node_marker(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """An init container that waits for the marker on a hostPath of the same directory, and a
    unit of the pool's image that writes it."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if not _gpu_pools(inputs) or workload is None:
        return []
    marker, writer = str(value["marker"]), str(value["writer"])
    directory = marker.rsplit("/", 1)[0]
    spec = _pod_spec(workload)
    host_dirs = {v.get("name"): (v.get("hostPath") or {}).get("path") for v in spec.get("volumes") or []}
    waits = [c for c in spec.get("initContainers") or []
             if marker in " ".join(map(str, [*(c.get("command") or []), *(c.get("args") or [])]))
             and any(m.get("mountPath") == directory and host_dirs.get(m.get("name")) == directory
                     for m in c.get("volumeMounts") or [])]
    findings = []
    if not waits:
        findings.append(_finding(
            name, contract, req, value["workload"],
            f"no init container waits for {marker} with the host's {directory} mounted at the same path",
            f"give it an init container that waits for {marker} (kilonode.k8s.gpu device_plugin_wait_container)"))
    for pool in _gpu_pools(inputs):
        written = _unit_writes(inputs, pool, writer, marker)
        if written:
            findings.append(_finding(name, contract, req, f"{pool.role()}: image", written,
                                     f"the GPU image's {writer} must write {marker} once the devices are ready "
                                     "(kilonode.image.gpu NVIDIA_DEVICES_UNIT_TEXT)"))
    return findings


def _devices_unit(inputs: Inputs, pool: NodePoolPlan) -> tuple[str | None, list[str], str]:
    """(the device unit's path, its Exec lines, whose word): the built manifest's with --images
    where it records one, else what the image build writes."""
    manifest = _manifest(inputs, pool)
    toolkit = ((manifest or {}).get("gpu") or {}).get("container_toolkit")
    if toolkit is not None and toolkit.get("present"):
        return toolkit.get("devices_unit"), list(toolkit.get("devices_unit_exec") or []), \
            f"the built image {manifest.get('name') if manifest else ''}"
    exec_lines = [line.split("=", 1)[1] for line in image_gpu.NVIDIA_DEVICES_UNIT_TEXT.splitlines()
                  if line.startswith(("ExecStart=", "ExecStartPost="))]
    return image_gpu.NVIDIA_DEVICES_UNIT_PATH, exec_lines, "the image build (kilonode.image.gpu)"


def _unit_writes(inputs: Inputs, pool: NodePoolPlan, writer: str, marker: str) -> str | None:
    """Why the pool's image does not write the marker from that unit; None when it does."""
    path, exec_lines, whose = _devices_unit(inputs, pool)
    if not path or not path.endswith(f"/{writer}"):
        return f"{whose} installs no {writer} ({path or 'none'})"
    if not any(marker in line for line in exec_lines):
        return f"{whose}'s {writer} never writes {marker} (it runs: {'; '.join(exec_lines) or 'nothing'})"
    return None


def _host_network(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    workload = _workload(inputs, req.value["workload"])
    if not _gpu_pools(inputs) or workload is None or _pod_spec(workload).get("hostNetwork") is True:
        return []
    return [_finding(name, contract, req, req.value["workload"],
                     "its pods are not on the host network: each takes one of its node's pod IPs",
                     "run it with hostNetwork: true (it serves only the kubelet's unix socket)")]


def _container_env(workload: Resource | None, container: str) -> dict[str, str]:
    """A workload's container's literal env (name -> value)."""
    spec = _pod_spec(workload) if workload is not None else {}
    found = next((c for c in spec.get("containers") or [] if c.get("name") == container), {})
    return {e.get("name"): str(e.get("value")) for e in found.get("env") or [] if "value" in e}


def _dev_char_links(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """On GPU pools whose kubelet uses the named cgroup driver, the image runs the command in the
    named unit, and the device plugin puts the devices in the container's spec (its env)."""
    value = req.value
    findings = []
    workload = _workload(inputs, value["workload"])
    key, _, wanted = str(value["env"]).partition("=")
    have = _container_env(workload, value["container"]).get(key)
    if _gpu_pools(inputs) and workload is not None and have != wanted:
        findings.append(_finding(
            name, contract, req, f"{value['workload']} container {value['container']}",
            f"{key} is {have or 'unset'}: the GPUs reach a container only through the toolkit's hook, not its spec, "
            "and a daemon-reload drops them whatever the links",
            f"set {key}={wanted} (kilonode.k8s.gpu DEVICE_PLUGIN_ENV)"))
    for pool in _gpu_pools(inputs):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            # the driver runc runs the GPU containers with: the device rules at stake are runc's
            # systemd cgroup manager's, whatever the kubelet's configuration says (cgroupDriverMatchesKubelet)
            runtime = value["runtimeConfigs"].get(pool.runtime) or {}
            config = str(runtime.get("config"))
            text = inputs.host_files(host).get(config.lstrip("/")) if runtime else None
            if text is None:
                continue  # no GPU variant of the runtime's configuration rendered: nothing runs GPU containers
            driver = runtime_cgroup_drivers(text, runtime["format"]).get(default_handler(text, runtime["format"]))
            if driver != value["whenCgroupDriver"]:
                continue
            path, exec_lines, whose = _devices_unit(inputs, pool)
            if path and path.endswith(f"/{value['unit']}") and any(value["command"] in line for line in exec_lines):
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: image",
                f"the runtime's cgroup driver for GPU containers ({config}) is {driver} and {whose} runs no "
                f"`{value['command']}` ({value['unit']}: {path or 'absent'})",
                f"install and enable {value['unit']} running `{value['command']}` with the toolkit "
                "(kilonode.image.gpu NVIDIA_DEVICES_UNIT_TEXT)"))
            break  # one finding per pool: the image is the pool's
    return findings


def _kernel_of(inputs: Inputs, pool: NodePoolPlan) -> tuple[str, dict[str, str] | None, str]:
    """(the kernel's name, its options or None when unknown, whose word) for the pool's image."""
    manifest = _manifest(inputs, pool)
    built = (manifest or {}).get("kernel")
    if built and built.get("config") is not None:
        return str(built.get("release")), dict(built["config"]), f"the built image {manifest.get('name')}"
    image = _recipe().kernel_for(pool.image_extras).image
    kernel = kernels().get(image)
    return image, dict(kernel.options) if kernel else None, "catalog/kernels.yaml"


def _boot_modules(inputs: Inputs, pool: NodePoolPlan) -> set[str]:
    """The modules the pool's image loads at boot: the built manifest's modules-load.d with
    --images where it records it, else the recipe overlays' modules-load.d."""
    built = ((_manifest(inputs, pool) or {}).get("kernel") or {}).get("boot_modules")
    if built is not None:
        return set(built)
    recipe = _recipe()
    extras = pool.image_extras
    modules: set[str] = set()
    for root in (recipe.overlay_dir, *(recipe.extra_overlay_dir(e) for e in extras)):
        for conf in sorted((root / "etc" / "modules-load.d").glob("*.conf")):
            modules |= {line.split("#", 1)[0].strip() for line in conf.read_text().splitlines()} - {""}
    return modules


def _kernel_option_for_selector(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """A selector of the component's config that needs a kernel option: the InfiniBand pools' kernel
    has it, and a module option is loaded at boot."""
    value = req.value
    config_map = _workload(inputs, value["configMap"])
    text = ((config_map.inputs.get("data") or {}).get("config.json") if config_map else None) or "{}"
    entries = json.loads(text).get("configList", [])
    uses = any((entry.get("selectors") or {}).get(value["selector"]) for entry in entries)
    if not uses:
        return []
    findings = []
    for pool in (p for p in inputs.plan.node_pools if p.infiniband):
        kernel, options, whose = _kernel_of(inputs, pool)
        option = (options or {}).get(value["kernelOption"])
        if options is None:
            here = f"the image's kernel {kernel} is not in catalog/kernels.yaml: its {value['kernelOption']} is unknown"
        elif option not in {"y", "m"}:
            here = f"the image's kernel {kernel} ({whose}) is built without {value['kernelOption']}"
        elif option == "m" and value["module"] not in _boot_modules(inputs, pool):
            here = (f"{value['kernelOption']} is a module in {kernel}, and the image loads no {value['module']} at "
                    "boot (modules-load.d)")
        else:
            continue
        findings.append(_finding(
            name, contract, req, f"{pool.role()}: image kernel",
            f"{value['configMap']} selects by {value['selector']}; {here}",
            f"boot InfiniBand pools on a kernel with {value['kernelOption']} and load {value['module']} "
            "(node-image/recipe.toml [extras.infiniband.kernel], node-image/infiniband/rootfs/etc/modules-load.d), "
            "or select the HCAs without a netdev"))
    return findings


def _gpu_direct_path(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Each InfiniBand GPU pool has every piece of the DMA-BUF path: the open module, the kernel option,
    rdma-core (with --images) and an NCCL new enough in the job image."""
    value = req.value
    findings = []
    provides = catalog_components.components().nccl_benchmark.provides
    nccl, rdma_core = provides.get("nccl"), provides.get(value["rdmaCorePackage"])
    for pool in (p for p in inputs.plan.node_pools if p.infiniband and p.gpus_per_node > 0):
        extras = pool.image_extras
        declared = _recipe().declared_packages(pool.runtime, extras)
        kernel, options, whose = _kernel_of(inputs, pool)
        missing = []
        built = (((_manifest(inputs, pool) or {}).get("gpu") or {}).get("driver") or {}).get("kernel_module")
        module = built or next((p for p in declared if p.startswith("nvidia-") and p.endswith("kernel-dkms")), None)
        if module != value["driverModulePackage"]:
            whose = "the built image's" if built else "the image's"
            missing.append(f"{whose} GPU kernel module is {module or 'none'}, not {value['driverModulePackage']}")
        lacking = [o for o in value["kernelOptions"] if (options or {}).get(o) != "y"]
        if lacking:
            missing.append(f"the kernel {kernel} ({whose}) lacks {', '.join(f'{o}=y' for o in lacking)}")
        if rdma_core and _version(rdma_core) < _version(str(value["rdmaCoreMin"])):
            missing.append(f"the NCCL job image's {value['rdmaCorePackage']} {rdma_core} is older than "
                           f"{value['rdmaCoreMin']} (catalog/components.yaml ncclBenchmark provides)")
        if nccl is None or _version(nccl) < _version(str(value["ncclMin"])):
            missing.append(f"the NCCL job image's NCCL is {nccl or 'unknown'}, older than {value['ncclMin']} "
                           "(catalog/components.yaml ncclBenchmark provides.nccl)")
        if missing:
            findings.append(_finding(
                name, contract, req, f"{pool.role()}: GPUDirect RDMA", "; ".join(missing),
                "give InfiniBand pools the open GPU kernel module, a DMA-BUF kernel and an NCCL of 2.13 or later "
                "(node-image/packages/gpu.txt, catalog/components.yaml)"))
    if rdma_core is None and findings == [] and any(p.infiniband and p.gpus_per_node for p in inputs.plan.node_pools):
        findings.append(_finding(
            name, contract, req, "NCCL job image (catalog/components.yaml ncclBenchmark)",
            f"the job image's {value['rdmaCorePackage']} is not recorded, so its ibv_reg_dmabuf_mr "
            f"({value['rdmaCorePackage']} {value['rdmaCoreMin']}+) is assumed, not known",
            f"record the image's {value['rdmaCorePackage']} version in ncclBenchmark provides (from its release notes "
            "or `dpkg -s rdma-core` in the image); a run's log says it too: \"DMA-BUF is available on GPU device\" "
            "and channels via NET/IB/<n>/GDRDMA", level="warn"))
    return findings


def _nccl_job_environment(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """While the job image's NCCL (ncclBenchmark provides.nccl; unrecorded counts as older) is older
    than `ncclBefore`: on every InfiniBand GPU pool of the named topology families, the job kilonode
    generates for a two-node gang over InfiniBand (kilonode.k8s.nccl_job.environment) sets each of
    `env` to its value."""
    value = req.value
    nccl = catalog_components.components().nccl_benchmark.provides.get("nccl")
    if nccl is not None and _version(nccl) >= _version(str(value["ncclBefore"])):
        return []
    findings = []
    for pool in (p for p in _gpu_pools(inputs) if p.infiniband and p.nccl_topology in value["families"]):
        assert pool.nccl_topology is not None
        env = {e["name"]: e["value"] for e in nccl_job.environment(
            pool.nccl_topology, cross_fabric=False, infiniband_gbps=pool.infiniband_gbps, nodes=2)}
        wrong = [f"{key} is {env[key]!r}" if key in env else f"{key} is unset"
                 for key, wanted in value["env"].items() if env.get(key) != str(wanted)]
        if wrong:
            findings.append(_finding(
                name, contract, req, f"{pool.role()}: NCCL job environment ({pool.nccl_topology})",
                f"the job image's NCCL is {nccl or 'unrecorded'}, older than {value['ncclBefore']}, and in the job "
                f"generated for a gang on {pool.vm_size} {', '.join(wrong)}",
                f"set {', '.join(f'{k}={v}' for k, v in value['env'].items())} for the {pool.nccl_topology} family "
                "(kilonode.plan.wellknown.NCCL_FAMILY_POD_SETTINGS), or move ncclBenchmark to an image whose NCCL is "
                f"{value['ncclBefore']} or later"))
    return findings


def _version(text: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version ("44.0-2" -> (44, 0), "2.18.3" -> (2, 18, 3))."""
    found = re.match(r"\d+(?:\.\d+)*", text.split(":", 1)[-1])
    return tuple(int(n) for n in found.group(0).split(".")) if found else ()


def _waits_for_fabric_state(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """NVSwitch pools: the agent's rendered configuration, or the default the agent ships with,
    gives it a fabric wait longer than zero."""
    value = req.value
    default = _shipped_default(value["defaultFile"], value["defaultTable"], value["defaultKey"])
    findings = []
    for pool in (p for p in _gpu_pools(inputs) if p.nvswitch):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["config"]).lstrip("/"))
            config = json.loads(text) if text else {}
            wait = config.get(value["configKey"], default)
            if isinstance(wait, int | float) and wait > 0:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: {value['config']}",
                f"{pool.vm_size} has NVSwitch and the agent's fabric wait is {wait!r} ({value['configKey']} in the "
                f"rendered configuration, else {value['defaultKey']} of kilonode/{value['defaultFile']}): its first "
                "active check does not wait for fabric state Completed",
                f"leave {value['configKey']} out (the agent's default) or give it a positive number of seconds"))
            break
    return findings


def _shipped_default(file: str, table: str, key: str) -> object:
    """A default the node program ships with (a TOML file of the kilonode package), or None."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / file
    return tomllib.loads(path.read_text()).get(table, {}).get(key) if path.is_file() else None


def _held_for_rescan(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The component's ConfigMap sets a rescan interval above 0 (`intervalDefault` where it sets
    none), and on every host of the named pools the node program's rendered JSON setting holds the
    node at least that long."""
    value = req.value
    config_map, document = _config_map_document(inputs, value["configMap"], value["key"], "json")
    if config_map is None:
        return []  # the component is not deployed by this stack
    interval = _at(document, value["interval"]) if isinstance(document, Mapping) else None
    interval = value["intervalDefault"] if interval is None else interval
    if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
        return [_finding(name, contract, req, f"{value['configMap']} {value['key']}",
                         f"{value['interval']} is {interval!r}: the component never looks for devices again after "
                         "its start", f"give {value['interval']} a positive number of seconds (kilonode.k8s.rdma)")]
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value["pools"]](p)):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["config"]).lstrip("/"))
            held = json.loads(text).get(value["configKey"]) if text else None
            if isinstance(held, int) and not isinstance(held, bool) and held >= interval:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: {value['config']}",
                f"{value['configKey']} is {held!r}, short of the {interval} s {value['interval']} "
                f"of {value['configMap']}", f"render {value['configKey']}: {interval} or more for these pools "
                "(kilonode.render.pool; the pool's size must record its infinibandLinks for the agent to await them)"))
    return findings


# Which pools a renderedSetting line names: a predicate on the plan's pool.
POOL_SETS: dict[str, Callable[[NodePoolPlan], bool]] = {
    "all": lambda p: True,
    "gpu": lambda p: p.gpus_per_node > 0,
    "infiniband-gpu": lambda p: p.gpus_per_node > 0 and p.infiniband,
    "nvswitch": lambda p: p.gpus_per_node > 0 and p.nvswitch,
}


def _rendered_setting(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every host of the named pools has the rendered JSON file with the key (a dotted path, list
    items by index: `plugins.0.mode`) at the value."""
    value = req.value
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value["pools"]](p)):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["config"]).lstrip("/"))
            have = _at(json.loads(text), str(value["key"])) if text else None
            if have == value["equals"]:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: {value['config']}",
                f"{value['key']} is {have!r} there" if text else f"the host has no {value['config']}",
                f"render {value['key']}: {json.dumps(value['equals'])} for these pools (kilonode.render.pool)"))
    return findings


def _cgroup_v2(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every host of the named pools boots the unified cgroup hierarchy (no kernel parameter in the
    image's command line asks systemd for the legacy one: the built manifest's with --images, else
    the recipe's), or its rendered kubelet configuration sets the key to false."""
    value = req.value
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value["pools"]](p)):
        manifest = _manifest(inputs, pool) or {}
        cmdline = str(manifest.get("kernel_cmdline") or _recipe().kernel_cmdline)
        legacy = [param for param in cmdline.split() if param in value["legacyParameters"]]
        if not legacy:
            continue
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["kubeletConfig"]).lstrip("/"))
            config = load_yaml(text) if text else None
            if isinstance(config, Mapping) and config.get(value["key"]) is False:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: kernel command line",
                f"the image boots with {' '.join(legacy)} (the legacy cgroup v1 hierarchy), and "
                f"{value['kubeletConfig']} does not set {value['key']}: false",
                f"drop {' '.join(legacy)} from node-image/recipe.toml's kernel_cmdline (Debian boots cgroup v2 by "
                "default), or render failCgroupV1: false for these pools until they move"))
    return findings


# The kubelet's cgroupDriver when its configuration names none (kubernetes/kubelet@v0.34.2
# config/v1beta1/types.go:389-393 KubeletConfiguration.CgroupDriver, "Default: \"cgroupfs\"").
KUBELET_DEFAULT_CGROUP_DRIVER = "cgroupfs"


def runtime_cgroup_drivers(text: str, form: str) -> dict[str, str]:
    """The cgroup driver of each runtime handler a rendered runtime configuration defines.

    `containerdRuncOptions`: a containerd 1.6/1.7 config.toml (version 2); each runtime of the CRI
    plugin whose runtime_type is io.containerd.runc.v2, systemd where its options set SystemdCgroup,
    else cgroupfs (the shim runs runc with --systemd-cgroup only then: containerd/containerd@v1.7.34
    runtime/v2/runc/container.go:203, pkg/process/init.go:82-93). `dockerExecOpts`: a daemon.json's
    exec-opts native.cgroupdriver, the daemon's driver that `docker info` reports and cri-dockerd
    takes (Mirantis/cri-dockerd@665a141d core/docker_service.go:219-238), keyed "*"; none when the
    file names none (Docker's default is not judged here)."""
    if form == "containerdRuncOptions":
        cri = (tomllib.loads(text).get("plugins") or {}).get("io.containerd.grpc.v1.cri") or {}
        runtimes = (cri.get("containerd") or {}).get("runtimes") or {}
        return {handler: "systemd" if (runtime.get("options") or {}).get("SystemdCgroup") is True else "cgroupfs"
                for handler, runtime in runtimes.items()
                if runtime.get("runtime_type") == "io.containerd.runc.v2"}
    if form == "dockerExecOpts":
        opts = [str(o) for o in json.loads(text).get("exec-opts") or []]
        named = [o.split("=", 1)[1].strip() for o in opts if o.split("=", 1)[0].strip() == "native.cgroupdriver"]
        return {"*": named[-1]} if named else {}
    raise ValueError(f"unknown runtime configuration form {form!r}")


def default_handler(text: str, form: str) -> str:
    """The handler a pod without a runtimeClass runs with: containerd's default_runtime_name ("runc"
    when unset, containerd/containerd@v1.7.34 pkg/cri/config/config_unix.go:74), or "*",
    Docker's one driver."""
    if form == "containerdRuncOptions":
        cri = (tomllib.loads(text).get("plugins") or {}).get("io.containerd.grpc.v1.cri") or {}
        return str((cri.get("containerd") or {}).get("default_runtime_name") or "runc")
    return "*"


def _cgroup_driver_matches_kubelet(inputs: Inputs, name: str, contract: Contract,
                                   req: Requirement) -> list[Finding]:
    """On every host of the pools running the named runtime, the kubelet's cgroupDriver (its
    rendered configuration's, cgroupfs when it names none) equals the driver of every runtime
    handler of each rendered runtime configuration. Where the runtime reports its driver to the
    kubelet (`kubeletAsksRuntime`: the CRI RuntimeConfig call, which the kubelet then obeys), a
    field that disagrees is inert: a warning; where it does not, the kubelet runs with its own
    field and a disagreement is a break, said as `whenKubeletSays` has it for the kubelet's driver."""
    value = req.value
    level = "warn" if value["kubeletAsksRuntime"] else "break"
    findings = []
    for pool in (p for p in inputs.plan.node_pools if p.runtime == value["runtime"]):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            files = inputs.host_files(host)
            kubelet_text = files.get(str(value["kubeletConfig"]).lstrip("/"))
            if kubelet_text is None:
                continue
            kubelet = (load_yaml(kubelet_text) or {}).get("cgroupDriver") or KUBELET_DEFAULT_CGROUP_DRIVER
            differing = []
            for config in value["runtimeConfigs"]:
                text = files.get(str(config).lstrip("/"))
                if text is None:
                    continue
                differing += [f"{config} {'handler ' + h if h != '*' else 'native.cgroupdriver'} {d}"
                              for h, d in sorted(runtime_cgroup_drivers(text, value["format"]).items()) if d != kubelet]
            if not differing:
                continue
            if value["kubeletAsksRuntime"]:
                here = (f"the kubelet's configuration says cgroupDriver {kubelet}, the runtime runs "
                        f"{'; '.join(differing)}: the kubelet asks the runtime and uses its driver, so the field is "
                        "inert, but it names a driver the node does not run")
                fix = (f"render cgroupDriver as the runtime's driver in {value['kubeletConfig']} "
                       "(kilonode.render.pool kubelet_config)")
            else:
                said = value["whenKubeletSays"].get(kubelet, "the two disagree")
                here = (f"the kubelet runs with cgroupDriver {kubelet} (the runtime does not report its own), the "
                        f"runtime with {'; '.join(differing)}: {said}")
                fix = (f"render one driver for the kubelet ({value['kubeletConfig']} cgroupDriver) and every runtime "
                       "handler (kilonode.render.pool kubelet_config, containerd_config)")
            findings.append(_finding(name, contract, req, f"{host}: {value['kubeletConfig']}", here, fix, level))
    return findings


def sysctl_file_values(text: str) -> dict[str, str]:
    """A sysctl.d file's settings as systemd-sysctl reads them (`key = value`, `#`/`;` comments,
    `/` in a key read as `.`, the last setting of a key winning), values as written."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip().lstrip("-").replace("/", ".")] = value.strip()
    return values


def _node_sysctls(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every host of the named pools has the rendered sysctl.d file, and it sets each key to the
    value (compared as written: the kernel reads these tunables as integers)."""
    value = req.value
    wanted = {str(key): str(v) for key, v in value["equals"].items()}
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value["pools"]](p)):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["config"]).lstrip("/"))
            have = sysctl_file_values(text) if text is not None else {}
            wrong = [f"{key} is {have[key]}" if key in have else f"{key} is not set"
                     for key, want in wanted.items() if have.get(key) != want]
            if not wrong:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: {value['config']}",
                "; ".join(wrong) if text is not None else f"the host has no {value['config']}",
                "set " + ", ".join(f"{key} = {want}" for key, want in wanted.items())
                + " in the pool's sysctl profile (sysctl/) and take no stack override of them"))
    return findings


def _pod_needs(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The workload's pod spec holds what the line names: `hostNetwork`, `hostPID`, a container's `args`, its
    `privileged`, the `capabilities` in its bounding set (added, or privileged), its `env` values,
    `hostPaths` mounted into it, and `mountPropagation` (host path -> mode) of those mounts."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []  # not deployed by this stack: nothing to judge
    spec = _pod_spec(workload)
    problems = []
    if "hostNetwork" in value and bool(spec.get("hostNetwork")) != value["hostNetwork"]:
        problems.append(f"hostNetwork is {bool(spec.get('hostNetwork'))}, not {value['hostNetwork']}")
    if "hostPID" in value and bool(spec.get("hostPID")) != value["hostPID"]:
        problems.append(f"hostPID is {bool(spec.get('hostPID'))}, not {value['hostPID']}")
    container = next((c for c in spec.get("containers") or [] if c.get("name") == value.get("container")), {})
    if "args" in value:
        words = [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]
        problems += [f"container {value.get('container')} runs without {arg}" for arg in value["args"]
                     if arg not in words]
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    if "privileged" in value and privileged != value["privileged"]:
        problems.append(f"container {value.get('container')} is not privileged" if value["privileged"]
                        else f"container {value.get('container')} is privileged")
    if "capabilities" in value and not privileged:
        _, added = _capabilities(container)
        problems += [f"container {value.get('container')} is not privileged and adds no {cap}"
                     for cap in value["capabilities"] if cap not in added]
    if "env" in value:
        env = {e.get("name"): e.get("value") for e in container.get("env") or []}
        problems += [f"container {value.get('container')} has {key}={env.get(key)!r}, not {want!r}"
                     for key, want in value["env"].items() if env.get(key) != str(want)]
    if "hostPaths" in value:
        host = {v.get("name"): (v.get("hostPath") or {}).get("path") for v in spec.get("volumes") or []}
        mounted = {host.get(m.get("name")) for m in container.get("volumeMounts") or []}
        problems += [f"container {value.get('container')} does not mount the host's {path}"
                     for path in value["hostPaths"] if path not in mounted]
    if "mountPropagation" in value:
        host = {v.get("name"): (v.get("hostPath") or {}).get("path") for v in spec.get("volumes") or []}
        modes = {host.get(m.get("name")): m.get("mountPropagation") or "None"
                 for m in container.get("volumeMounts") or []}
        problems += [f"container {value.get('container')} mounts the host's {path} with propagation "
                     f"{modes.get(path, 'None (not mounted)')}, not {mode}"
                     for path, mode in value["mountPropagation"].items() if modes.get(path) != mode]
    if not problems:
        return []
    return [_finding(name, contract, req, value["workload"], "; ".join(problems),
                     "give the workload what upstream's manifest gives it (the contract's source)")]


# --- settings of a configuration file: the render's, a ConfigMap's --------------------------------


_MISSING = object()


def _at(document: Any, path: str) -> Any:
    """A dotted path into a parsed document (`detectLocal.interfaceNamePrefix`, `plugins.0.mode`);
    None where any step is missing."""
    here = document
    for step in path.split("."):
        if isinstance(here, Mapping) and step in here:
            here = here[step]
        elif isinstance(here, list) and step.isdigit() and int(step) < len(here):
            here = here[int(step)]
        else:
            return None
    return here


def _all_at(document: Any, path: str) -> list[Any]:
    """Every value a path reaches, where a step may also be `*` (each item of a list) or
    `key=value` (the items of a list whose `key` is `value`):
    `profiles.*.pluginConfig.name=Coscheduling.args`."""
    found = [document]
    for step in path.split("."):
        key, equals, wanted = step.partition("=")
        here: list[Any] = []
        for item in found:
            if isinstance(item, list) and step == "*":
                here += item
            elif isinstance(item, list) and equals:
                here += [i for i in item if isinstance(i, Mapping) and str(i.get(key)) == wanted]
            elif _at(item, step) is not None:
                here.append(_at(item, step))
        found = here
    return found


def _config_map_document(inputs: Inputs, named: str, key: str, fmt: str = "yaml") -> tuple[Resource | None, Any]:
    """(the ConfigMap, its key parsed as JSON or YAML); the document is _MISSING when the key is
    absent, and None when it does not parse."""
    config_map = _workload(inputs, named)
    text = ((config_map.inputs.get("data") or {}).get(key) if config_map is not None else None)
    if not isinstance(text, str):
        return config_map, _MISSING
    try:
        return config_map, json.loads(text) if fmt == "json" else load_yaml(text)
    except (ValueError, yaml.YAMLError):
        return config_map, None


def _flag_value(container: Mapping[str, Any], flag: str) -> list[str]:
    """Every value a container's command line gives a flag (`--flag=v` or `--flag v`)."""
    words = [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]
    found = [w.split("=", 1)[1] for w in words if w.startswith(f"{flag}=")]
    found += [words[i + 1] for i, w in enumerate(words[:-1]) if w == flag]
    return found


def _container(spec: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((c for c in spec.get("containers") or [] if c.get("name") == name), None)


def _reads_config_map(spec: Mapping[str, Any], container: Mapping[str, Any], config_map: str, key: str,
                      path: str) -> bool:
    """Whether `path` in the container is the ConfigMap's key: a mount of a volume of that
    ConfigMap holds it under the key's name (or the item the volume maps the key to)."""
    volumes = {v.get("name"): v.get("configMap") for v in spec.get("volumes") or [] if v.get("configMap")}
    for mount in container.get("volumeMounts") or []:
        source, where = volumes.get(mount.get("name")), str(mount.get("mountPath", "")).rstrip("/")
        if not source or source.get("name") != config_map or not path.startswith(f"{where}/"):
            continue
        relative = path.removeprefix(f"{where}/")
        items = source.get("items")
        if (items and any(i.get("key") == key and i.get("path") == relative for i in items)) or \
                (not items and relative == key):
            return True
    return False


def _config_map_setting(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """A ConfigMap's configuration file sets each `equals` path to its value and each `present`
    path to something, and what each `knownKeys` path reaches holds no other key (a strict
    decoder's fields); with `consumer`, the workload's container is given that very file by the
    named flag (a mount of the ConfigMap), so that the file judged is the file read."""
    value = req.value
    named, key, fmt = value["configMap"], value["key"], value.get("format", "yaml")
    consumer = value.get("consumer") or {}
    reader = _workload(inputs, consumer["workload"]) if consumer else None
    config_map, document = _config_map_document(inputs, named, key, fmt)
    if config_map is None and reader is None:
        return []  # the component is not deployed by this stack
    where = f"{named} {key}"
    problems = []
    if document is _MISSING:
        problems.append(f"there is no {named} with a key {key}")
    elif not isinstance(document, Mapping):
        problems.append(f"{key} is not a {fmt.upper()} document")
    else:
        for path, wanted in (value.get("equals") or {}).items():
            have = _at(document, path)
            if have != wanted:
                problems.append(f"{path} is {have!r}, not {wanted!r}")
        problems += [f"{path} is not set" for path in value.get("present") or [] if _at(document, path) in (None, "")]
        for path, known in (value.get("knownKeys") or {}).items():
            problems += [f"{path} has {key}, a field it does not decode" for found in _all_at(document, path)
                         if isinstance(found, Mapping) for key in found if key not in known]
    if reader is not None:
        spec = _pod_spec(reader)
        container = _container(spec, consumer["container"]) or {}
        paths = _flag_value(container, consumer["flag"])
        config_name = named.rpartition("/")[2]
        if not any(_reads_config_map(spec, container, config_name, key, p) for p in paths):
            problems.append(
                f"{consumer['workload']} container {consumer['container']} is not given it: its {consumer['flag']} "
                f"({', '.join(paths) or 'unset'}) is no mount of {config_name}'s {key}")
    if not problems:
        return []
    return [_finding(name, contract, req, where, "; ".join(problems),
                     "render the setting as the contract's source says (the module that builds the ConfigMap)")]


def _kernel_at_least(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Where a ConfigMap's setting asks for it (`when`), every pool's image boots a kernel release
    at or above `minimum`: the built manifest's with --images, else the recipe's kernel as
    catalog/kernels.yaml measured it."""
    value = req.value
    when = value["when"]
    _, document = _config_map_document(inputs, when["configMap"], when["key"])
    if document is _MISSING or not isinstance(document, Mapping) or _at(document, when["path"]) != when["equals"]:
        return []
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value.get("pools", "all")](p)):
        built = ((_manifest(inputs, pool) or {}).get("kernel") or {}).get("release")
        if built:
            release, whose = str(built), f"the built image {(_manifest(inputs, pool) or {}).get('name')}"
        else:
            image = _recipe().kernel_for(pool.image_extras).image
            kernel = kernels().get(image)
            release, whose = (kernel.release if kernel else ""), f"{image} (catalog/kernels.yaml)"
        if not release:
            findings.append(_finding(
                name, contract, req, f"{pool.role()}: image kernel",
                f"{when['path']} is {when['equals']} and the image's kernel {whose} is not measured: whether it is "
                f"{value['minimum']} or later is unknown", "add the kernel to catalog/kernels.yaml", level="warn"))
        elif _version(release) < _version(str(value["minimum"])):
            findings.append(_finding(
                name, contract, req, f"{pool.role()}: image kernel",
                f"{when['configMap']} sets {when['path']}: {when['equals']}, and {whose} boots {release}, older than "
                f"{value['minimum']}",
                f"boot the pools on a kernel of {value['minimum']} or later, or set another {when['path']}"))
    return findings


# --- RBAC: what a workload's ServiceAccount may do ----------------------------------------------


def _matches(rule: Mapping[str, Any], group: str, resource: str, verb: str, name: str | None) -> bool:
    """A resource rule grants the request (k8s.io rbac validation rule.go: VerbMatches,
    APIGroupMatches, ResourceMatches with `*` and `*/<subresource>`, ResourceNameMatches)."""
    def has(key: str, item: str) -> bool:
        return item in (rule.get(key) or []) or "*" in (rule.get(key) or [])
    if not has("verbs", verb) or not has("apiGroups", group):
        return False
    resources = rule.get("resources") or []
    sub = resource.partition("/")[2]
    if not (resource in resources or "*" in resources or (sub and f"*/{sub}" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def _url_matches(rule: Mapping[str, Any], url: str, verb: str) -> bool:
    verbs = rule.get("verbs") or []
    if verb not in verbs and "*" not in verbs:
        return False
    return any(u == url or u == "*" or (u.endswith("*") and url.startswith(u[:-1]))
               for u in rule.get("nonResourceURLs") or [])


class _Access:
    """What one ServiceAccount may do, as the graph's and the apiserver's own RBAC grant it:
    ClusterRoleBindings everywhere, RoleBindings in their namespace; roles not known here are
    kept by name (a request they might grant is not judged a break)."""

    def __init__(self, inputs: Inputs, namespace: str, account: str) -> None:
        objects = [_RbacObject(r) for r in inputs.resources if r.is_kubernetes]
        rbac = apiload.Rbac(objects)
        # the apiserver's own Roles (catalog/rbac.yaml roles), then the graph's
        roles = {(str(r["metadata"]["namespace"]), str(r["metadata"]["name"])): r for r in builtin_rbac().roles}
        roles |= {(str((r.inputs.get("metadata") or {}).get("namespace")), str((r.inputs.get("metadata") or {})
                  .get("name"))): r.inputs for r in inputs.resources if r.is_kubernetes and r.kind == "Role"}
        self.grants: list[tuple[str | None, list[Mapping[str, Any]]]] = []  # (namespace or None: all, rules)
        self.unreadable: list[tuple[str | None, str]] = []  # (namespace or None: all, the role)
        bindings = [(None, b) for b in rbac.bindings] + [
            (str((r.inputs.get("metadata") or {}).get("namespace")), r.inputs)
            for r in inputs.resources if r.is_kubernetes and r.kind == "RoleBinding"]
        for scope, binding in bindings:
            if not any(apiload._applies(s, namespace, account) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            kind, role = ref.get("kind"), str(ref.get("name"))
            if kind == "ClusterRole":
                rules = rbac.rules(role)
            else:
                body = roles.get((str(scope), role))
                rules = list(body.get("rules") or []) if body is not None else None
            if rules is None:
                self.unreadable.append((scope, f"{kind} {role}" + (f" in {scope}" if scope else "")))
                continue
            self.grants.append((scope, rules))

    def allows(self, group: str, resource: str, verb: str, namespace: str | None, name: str | None = None) -> bool:
        """Whether the request is granted: in `namespace`, or cluster-wide when it is None."""
        return any(any(_matches(r, group, resource, verb, name) for r in rules)
                   for scope, rules in self.grants if scope is None or scope == namespace)

    def allows_url(self, url: str, verb: str) -> bool:
        return any(_url_matches(r, url, verb) for scope, rules in self.grants if scope is None for r in rules)


@dataclass(frozen=True)
class _RbacObject:
    """A graph resource as kilonode.preflight.apiload reads objects (type, name, props)."""

    resource: Resource

    @property
    def type(self) -> str:
        return self.resource.type

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def props(self) -> Mapping[str, Any]:
        return self.resource.inputs


def _account_of(inputs: Inputs, workload: Resource) -> tuple[str, str, bool]:
    """(namespace, ServiceAccount, whether its pods get a token) of a workload's pods."""
    namespace = str((workload.inputs.get("metadata") or {}).get("namespace") or "default")
    spec = _pod_spec(workload)
    account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
    props = next((r.inputs for r in inputs.resources if r.is_kubernetes and r.kind == "ServiceAccount"
                  and (r.inputs.get("metadata") or {}).get("name") == account
                  and (r.inputs.get("metadata") or {}).get("namespace") == namespace), None)
    return namespace, account, apiload._token_mounted(spec, props)


def _request_text(verb: str, group: str, resource: str, namespace: str | None, name: str | None) -> str:
    what = f"{group}/{resource}" if group else resource
    return f"{verb} {what}" + (f" {name}" if name else "") + (f" in {namespace}" if namespace else " cluster-wide")


# A request the account is not granted: (how a finding says it, its namespace or None: cluster-wide).
Missing = tuple[str, str | None]


def _missing(access: _Access, rule: Mapping[str, Any], names: list[str | None]) -> list[Missing]:
    """The requests of one contract rule the account is not granted."""
    if "nonResourceURLs" in rule:
        return [(f"{verb} {url}", None) for url in rule["nonResourceURLs"] for verb in rule["verbs"]
                if not access.allows_url(url, verb)]
    namespace = rule.get("namespace")
    return [(_request_text(verb, group, resource, namespace, name), namespace)
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]
            for name in names if not access.allows(group, resource, verb, namespace, name)]


def _rbac_findings(name: str, contract: Contract, req: Requirement, where: str, account: str,
                   access: _Access, missing: list[Missing]) -> list[Finding]:
    """A break naming what is not granted; a warning where a role bound to the account that is not
    readable here (an apiserver's own role kilonode.catalog.rbac does not keep) could grant it: a
    ClusterRoleBinding's anywhere, a RoleBinding's in its namespace."""
    if not missing:
        return []
    spaces = {namespace for _, namespace in missing}
    unsure = sorted({role for scope, role in access.unreadable if scope is None or scope in spaces})
    unless = f"; unless {', '.join(unsure)} (not readable here) grants it" if unsure else ""
    shown = list(dict.fromkeys(text for text, _ in missing))
    return [_finding(name, contract, req, where, f"its ServiceAccount {account} may not {', '.join(shown)}{unless}",
                     "grant what upstream's manifest grants (the contract's source) to the workload's ServiceAccount",
                     level="warn" if unsure else "break")]


def _rbac_allows(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The workload's pods get a token, and their ServiceAccount is granted every request the
    line's `rules` name: verbs on resources (cluster-wide, or in a rule's `namespace`), named
    objects (`resourceNames`, or `resourceNameFrom` a path of a ConfigMap's file), URLs."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []
    namespace, account, token = _account_of(inputs, workload)
    if not token:
        return [_finding(name, contract, req, value["workload"],
                         f"its pods mount no token for ServiceAccount {namespace}/{account}: every API request it "
                         "makes is refused", "leave automountServiceAccountToken unset or true for this workload")]
    access = _Access(inputs, namespace, account)
    missing: list[Missing] = []
    for rule in value["rules"]:
        names: list[str | None] = list(rule.get("resourceNames") or []) or [None]
        source = rule.get("resourceNameFrom")
        if source:
            _, document = _config_map_document(inputs, source["configMap"], source["key"])
            named = _at(document, source["path"]) if isinstance(document, Mapping) else None
            if not named:
                continue  # the setting is another line's matter
            names = [str(named)]
        missing += _missing(access, rule, names)
    return _rbac_findings(name, contract, req, value["workload"], f"{namespace}/{account}", access, missing)


def _discovery_rbac(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Each Kubernetes service-discovery block of the workload's configuration (a ConfigMap's
    file) lists and watches, per role it names, the resources the line maps the role to: in the
    namespaces it names (its own with own_namespace), else cluster-wide; cluster-scoped ones
    always cluster-wide, nodes also where it attaches node metadata."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    _, document = _config_map_document(inputs, value["configMap"], value["key"])
    if workload is None or not isinstance(document, Mapping):
        return []
    namespace, account, token = _account_of(inputs, workload)
    access = _Access(inputs, namespace, account)
    findings = []
    for job in document.get(value["jobsKey"]) or []:
        for sd in job.get(value["sdKey"]) or []:
            if sd.get("api_server"):
                continue  # another cluster's API: not this RBAC
            role = str(sd.get("role"))
            resources = list(value["roles"].get(role) or [])
            if (sd.get("attach_metadata") or {}).get("node") and value["nodeResource"] not in resources:
                resources.append(value["nodeResource"])
            spaces = sd.get("namespaces") or {}
            names: list[str | None] = list(spaces.get("names") or [])
            if spaces.get("own_namespace"):
                names.append(namespace)
            missing: list[Missing] = []
            for full in resources:
                group, _, resource = full.rpartition("/")
                cluster = full in value["clusterScoped"] or not names
                missing += [(_request_text(verb, group, resource, ns, None), ns)
                            for ns in ([None] if cluster else names) for verb in value["verbs"]
                            if not access.allows(group, resource, verb, ns)]
            if not token:
                missing = [("anything (its pods mount no token)", None)]
            findings += _rbac_findings(name, contract, req,
                                       f"{value['workload']} job {job.get('job_name')} (role {role})",
                                       f"{namespace}/{account}", access, missing)
    return findings


# --- what a workload watches: CRDs; what a Corefile names --------------------------------------------


def _crd_present(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Where any of the line's workloads runs, each CRD is in the graph and serves the version."""
    value = req.value
    readers = [w for w in value["workloads"] if _workload(inputs, w) is not None]
    if not readers:
        return []
    crds = {(r.inputs.get("metadata") or {}).get("name"): r.inputs for r in inputs.resources
            if r.is_kubernetes and r.kind == "CustomResourceDefinition"}
    problems = []
    for crd in value["crds"]:
        body = crds.get(crd)
        served = [v.get("name") for v in ((body or {}).get("spec") or {}).get("versions") or [] if v.get("served")]
        if body is None:
            problems.append(f"no CustomResourceDefinition {crd}")
        elif value["version"] not in served:
            problems.append(f"{crd} does not serve {value['version']} (serves {', '.join(served) or 'nothing'})")
    if not problems:
        return []
    return [_finding(name, contract, req, ", ".join(readers), "; ".join(problems),
                     "install the component's CRDs as upstream ships them (kilonode/k8s/crds)")]


def _corefile_directives(text: str) -> list[tuple[str, list[str]]]:
    """(plugin, its arguments) for each directive of a Corefile's server blocks (depth one)."""
    found, depth = [], 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.replace("{", " { ").replace("}", " } ").split()
        if depth == 1 and words[0] not in "{}":
            found.append((words[0], [w for w in words[1:] if w not in "{}"]))
        depth += words.count("{") - words.count("}")
    return found


def _corefile_plugins(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every directive of the Corefile is a plugin compiled into the image, and each HTTP probe of
    the container asks a path and port that a plugin the Corefile enables serves."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []
    config_map = _workload(inputs, value["configMap"])
    text = ((config_map.inputs.get("data") or {}).get(value["key"]) if config_map is not None else None)
    if not isinstance(text, str):
        return [_finding(name, contract, req, value["configMap"], f"there is no {value['key']} in it",
                         "give CoreDNS its Corefile (kilonode.k8s.dns)")]
    directives = _corefile_directives(text)
    problems = [f"the Corefile names {plugin}, which {contract.version} is not built with"
                for plugin, _ in directives if plugin not in value["compiledIn"]]
    enabled = {plugin: args for plugin, args in directives}
    container = _container(_pod_spec(workload), value["container"]) or {}
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = (container.get(kind) or {}).get("httpGet")
        if not get:
            continue
        path, port = get.get("path"), get.get("port")
        serving = [p for p, where in value["probes"].items() if where["path"] == path]
        if not serving:
            problems.append(f"its {kind} asks {path} on {port}, which no plugin serves")
            continue
        plugin = serving[0]
        if plugin not in enabled:
            problems.append(f"its {kind} asks {path} on {port}, and the Corefile enables no {plugin}")
            continue
        address = next((a for a in enabled[plugin] if ":" in a), None)
        served_port = int(address.rpartition(":")[2]) if address else value["probes"][plugin]["port"]
        if served_port != port:
            problems.append(f"its {kind} asks {path} on {port}, and {plugin} serves it on {served_port}")
    if not problems:
        return []
    return [_finding(name, contract, req, f"{value['configMap']} {value['key']}", "; ".join(problems),
                     "keep the Corefile to the image's plugins, with health and ready where the probes ask "
                     "(kilonode.k8s.dns COREFILE)")]


# --- the autoscaler's node groups on Azure -----------------------------------------------------------


CUSTOM_ROLE = "azure-native:authorization:RoleDefinition"


def _azure_role_on_node_groups(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Each scale set the workload's `--nodes` flags name is a scale set of the graph, in the
    resource group its Azure configuration names (the one it lists), and the identity that
    configuration names holds one of the line's roles, or a custom role of the graph whose actions
    include the line's `actions`, on a scope containing it."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []
    container = _container(_pod_spec(workload), value["container"]) or {}
    groups = [flag.rpartition(":")[2] for flag in _flag_value(container, value["flag"])]
    _, config = _config_map_document(inputs, value["configMap"], value["key"], "json")
    config = config if isinstance(config, Mapping) else {}
    group = config.get(value["resourceGroupKey"])
    if not group:
        return []  # no configuration, or none with a resource group: the configuration's own line says so
    client = str(config.get(value["identityKey"]) or "")
    identity = client.removeprefix(value["mockClientPrefix"]) if client.startswith(value["mockClientPrefix"]) else None
    graph = identities._Graph(inputs)
    scale_sets = {str(r.inputs.get("vmScaleSetName", r.name)): r for r in graph.of(identities.SCALE_SET)}
    writers = set(value["roles"]) | _custom_roles_with(graph, value["actions"])
    assignments = [a for a in graph.of(identities.ROLE_ASSIGNMENT)
                   if identity is not None and identities._principal_name(a) == identity
                   and str(a.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower() in writers]
    findings = []
    for scale_set in groups:
        vmss = scale_sets.get(scale_set)
        if vmss is None:
            here = f"node group {scale_set} is no scale set of the graph"
        elif vmss.inputs.get("resourceGroupName") != group:
            here = (f"node group {scale_set} is in resource group {vmss.inputs.get('resourceGroupName')}, and the "
                    f"autoscaler lists the scale sets of {value['resourceGroupKey']} {group} only")
        elif identity is None:
            findings.append(_finding(
                name, contract, req, f"{value['workload']} node group {scale_set}",
                f"its {value['identityKey']} ({client or 'unset'}) names no identity of the graph: whether it may "
                "write the scale set is not known", "record the graph with kilonode's own identities", level="warn"))
            continue
        elif not any(vmss in graph.contained(str(a.inputs.get("scope", ""))) for a in assignments):
            roles = " or ".join(value["roles"].values())
            here = (f"identity {identity} holds no {roles}, nor a custom role with {', '.join(value['actions'])}, "
                    f"on a scope containing scale set {scale_set}")
        else:
            continue
        findings.append(_finding(name, contract, req, f"{value['workload']} node group {scale_set}", here,
                                 "grant the autoscaler's identity its custom role (AUTOSCALER_ACTIONS) on each node "
                                 "group's scale set, in the group its azure.json names (kilonode.azure.identity)"))
    return findings


def _custom_roles_with(graph: identities._Graph, needed: Sequence[str]) -> set[str]:
    """The GUIDs of the graph's custom role definitions whose actions grant every needed action
    (Azure's wildcards: `*` in an action matches any characters; compared case-insensitively),
    less what their notActions take away."""
    found = set()
    for role in graph.of(CUSTOM_ROLE):
        permissions = [p for p in role.inputs.get("permissions") or [] if isinstance(p, Mapping)]
        def grants(action: str, permissions: list[Mapping[str, Any]] = permissions) -> bool:
            return any(any(fnmatch.fnmatchcase(action.lower(), str(a).lower()) for a in p.get("actions") or [])
                       and not any(fnmatch.fnmatchcase(action.lower(), str(n).lower())
                                   for n in p.get("notActions") or []) for p in permissions)
        if all(grants(action) for action in needed):
            found.add(str(role.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower())
    return found


# --- a CSI controller's Azure rights over the disks and the instances it attaches them to ------------


def _mounted_config_map(spec: Mapping[str, Any], container: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    """(ConfigMap name, key) of the file a container reads at `path`: a mount of a ConfigMap volume
    holding it under the key's name (or the item the volume maps a key to)."""
    volumes = {v.get("name"): v.get("configMap") for v in spec.get("volumes") or [] if v.get("configMap")}
    for mount in container.get("volumeMounts") or []:
        source, where = volumes.get(mount.get("name")), str(mount.get("mountPath", "")).rstrip("/")
        if not source or not path.startswith(f"{where}/"):
            continue
        relative = path.removeprefix(f"{where}/")
        items = source.get("items")
        key = next((i.get("key") for i in items or [] if i.get("path") == relative), None) if items else relative
        if key:
            return str(source.get("name")), str(key)
    return None


def _azure_role_for_disks(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The workload reads its Azure configuration from a ConfigMap (the file its `env` names); the
    identity that configuration names is carried by the scale sets of every pool its pods may land
    on (the token comes from there), holds a role granting `groupActions` (one of `roles`, or a
    custom role of the graph) on a scope containing the resource group it names, and a role
    granting `attachActions` on a scope containing every scale set of the pools the `nodePlugin`
    DaemonSet may land on (where a disk is attached). That role on a scale set the node plugin does
    not run on is a warning: no disk is attached there, and the right is a write of its instances."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []
    spec = _pod_spec(workload)
    container = _container(spec, value["container"]) or {}
    path = _container_env(workload, value["container"]).get(value["env"], "")
    where = f"{value['workload']} container {value['container']}"
    fix = ("give the controller an identity of its own, on the controller pools' scale sets, with the disk "
           "actions on the pools' group and the instance write on its node plugin's scale sets, named in its own "
           "azure.json (kilonode.azure.identity DISK_CSI_ACTIONS, kilonode.k8s.storage)")
    mounted = _mounted_config_map(spec, container, path) if path else None
    if mounted is None:
        return [_finding(name, contract, req, where, f"its {value['env']} ({path or 'unset'}) is no mount of a "
                         "ConfigMap: which identity it acts as is not known", fix)]
    config_name, key = mounted
    namespace = str((workload.inputs.get("metadata") or {}).get("namespace") or "")
    _, config = _config_map_document(inputs, f"ConfigMap {namespace}/{config_name}", key, "json")
    config = config if isinstance(config, Mapping) else {}
    group = config.get(value["resourceGroupKey"])
    client = str(config.get(value["identityKey"]) or "")
    identity = client.removeprefix(value["mockClientPrefix"]) if client.startswith(value["mockClientPrefix"]) else None
    where = f"{where} ({config_name} {key})"
    if not group:
        return [_finding(name, contract, req, where, f"it sets no {value['resourceGroupKey']}", fix)]
    if identity is None:
        return [_finding(name, contract, req, where, f"its {value['identityKey']} ({client or 'unset'}) names no "
                         "identity of the graph: whether it may make and attach disks is not known",
                         "record the graph with kilonode's own identities", level="warn")]
    return _disk_rights_findings(inputs, name, contract, req, workload, identity, str(group), where, fix)


def _disk_rights_findings(inputs: Inputs, name: str, contract: Contract, req: Requirement, workload: Resource,
                          identity: str, group: str, where: str, fix: str) -> list[Finding]:
    """_azure_role_for_disks on the graph, once the identity and its resource group are known."""
    value = req.value
    graph = identities._Graph(inputs)
    groups = bootstrap_nodes(inputs)
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    scale_sets = {str(r.inputs.get("vmScaleSetName", r.name)): r for r in graph.of(identities.SCALE_SET)}

    def pools_of(workload: Resource) -> dict[str, NodePoolPlan]:
        placed = scheduling.placement_of(workload, groups, daemonsets)
        return {g.pool.name: g.pool for g in groups if g.host in {*placed.now, *placed.after_gpu_health}}

    def scopes(actions: Sequence[str]) -> list[str]:
        granting = set(value["roles"]) | _custom_roles_with(graph, actions)
        return [str(a.inputs.get("scope", "")) for a in graph.of(identities.ROLE_ASSIGNMENT)
                if identities._principal_name(a) == identity
                and str(a.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower() in granting]

    problems = []
    for pool in pools_of(workload).values():
        bare = [s.name for s in pool.shards if s.name in scale_sets
                and identity not in identities._scale_set_identities(scale_sets[s.name])]
        if bare:
            problems.append(f"its pods may run on pool {pool.name}, whose scale set(s) {', '.join(bare)} do not "
                            f"carry identity {identity}: no token there")
    resource_group = next((r for r in graph.of(identities.RESOURCE_GROUP)
                           if r.inputs.get("resourceGroupName") == group), None)
    if resource_group is None or not any(resource_group in graph.contained(s) for s in scopes(value["groupActions"])):
        problems.append(f"identity {identity} holds no role with {', '.join(value['groupActions'])} on a scope "
                        f"containing resource group {group}, where it makes and finds the disks")
    attach = scopes(value["attachActions"])
    plugin = _workload(inputs, value["nodePlugin"])
    plugin_sets = {s.name for p in (pools_of(plugin).values() if plugin is not None else ()) for s in p.shards}
    for scale_set in sorted(plugin_sets):
        vmss = scale_sets.get(scale_set)
        if vmss is not None and not any(vmss in graph.contained(s) for s in attach):
            problems.append(f"identity {identity} holds no role with {', '.join(value['attachActions'])} on a scope "
                            f"containing scale set {scale_set}, where {value['nodePlugin']} runs")
    findings = [_finding(name, contract, req, where, "; ".join(problems), fix)] if problems else []
    extra = sorted(n for n, vmss in scale_sets.items() if n not in plugin_sets
                   and any(vmss in graph.contained(s) for s in attach))
    if extra:
        findings.append(_finding(
            name, contract, req, where,
            f"identity {identity} may write the instances of scale set(s) {', '.join(extra)}, where "
            f"{value['nodePlugin']} does not run and no disk is attached", "scope the instance write to the node "
            "plugin's pools' scale sets (kilonode.azure.identity grant_disk_pools)", level="warn"))
    return findings


# --- an aggregated API server: the apiservers' side of it ---------------------------------------

APISERVER_UNIT = "etc/systemd/system/kube-apiserver.service"


def _apiserver_flags(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every apiserver's rendered unit runs with each of the line's `flags` (the value given, or any
    where it is null), and each flag named in `files` points at a file the host receives: rendered,
    or delivered by the Pulumi program (kilonode.plan.pki's layout for that host). Not judged on a
    host that runs `unlessUnit` (kube-proxy, for --enable-aggregator-routing)."""
    value = req.value
    layout = pki.pki_layout(inputs.plan)
    findings = []
    for host in (h for h in inputs.hosts() if h.startswith("apiserver-")):
        files = inputs.host_files(host)
        if APISERVER_UNIT not in files or f"etc/systemd/system/{value.get('unlessUnit')}" in files:
            continue
        flags = flags_of(unit_exec_args(files[APISERVER_UNIT]))
        problems = [f"it runs without --{flag}" if flag not in flags else f"--{flag}={flags[flag]}, not {want}"
                    for flag, want in value["flags"].items()
                    if flag not in flags or (want is not None and flags[flag] != str(want))]
        delivered = {f"/{path}" for path in files} | {f.path for f in layout.hosts.get(host, ())}
        problems += [f"--{flag}={flags[flag]} names a file the host does not receive"
                     for flag in value.get("files", []) if flag in flags and flags[flag] not in delivered]
        if problems:
            findings.append(_finding(name, contract, req, f"{host}: /{APISERVER_UNIT}", "; ".join(problems),
                                     "render the flags and deliver their files as kilonode.render.control_plane and "
                                     "kilonode.plan.pki do for the aggregation layer"))
    return findings


def _served_to_apiservers(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The apiservers reach the workload's pods on the line's `port`: its container serves it, and
    the NSGs in front of every pool the pods may land on (preflight's scheduling placement, with the
    pools whose GPU health taint must clear first) admit the control-plane subnet on it, as Azure
    evaluates a TCP flow (deployer_path `admits`)."""
    value = req.value
    source = IPv4Network(inputs.plan.network.control_plane_subnet)
    workload, port, findings = _served_through_nsgs(
        inputs, name, contract, req, "where the contract has it serve the apiservers",
        [(f"the control-plane subnet ({source})", source, "to the pool's subnet ")],
        f"admit {source} on {{port}}/TCP to the pools above every deny (kilonode.azure.network)")
    if workload is None:
        return findings
    pod, found = pod_isolation.pod_of(inputs, workload), pod_isolation.policies(inputs)
    refused = [str(i.ip) for i in inputs.plan.control_plane.instances
               if not netpol.admitted(found, netpol.Flow(IPv4Address(str(i.ip)), pod, port))]
    if refused:
        findings.append(_finding(
            name, contract, req, value["workload"],
            f"its NetworkPolicies refuse the apiservers {', '.join(refused)} on {port}/TCP",
            "admit each apiserver's address on the port (kilonode.k8s.network_policy KUBE_SYSTEM_INGRESS)"))
    return findings


def _served_to_pods(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every pod reaches the workload's pods on each of the line's `ports` ("53/UDP"): its container
    serves them, and the NetworkPolicies admit a pod of every namespace kilonode creates and of an
    ordinary one, and (host-network pods asking with their node's address) an address of every pool."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []
    container = _container(_pod_spec(workload), value["container"]) or {}
    declared = {(int(p.get("containerPort", 0)), str(p.get("protocol") or "TCP")) for p in container.get("ports") or []}
    wanted = [(int(port), proto or "TCP") for port, _, proto in (str(e).partition("/") for e in value["ports"])]
    missing = [f"{port}/{proto}" for port, proto in wanted if (port, proto) not in declared]
    if missing:
        return [_finding(name, contract, req, value["workload"],
                         f"container {value['container']} declares no {', '.join(missing)}",
                         "serve the ports the contract names, or read the contract again at the pinned tag")]
    pod, found = pod_isolation.pod_of(inputs, workload), pod_isolation.policies(inputs)
    namespaces = sorted({str((r.inputs.get("metadata") or {}).get("name"))
                         for r in inputs.of_type(pod_isolation.NAMESPACE)})
    sources: list[tuple[str, netpol.Pod | IPv4Address]] = [
        (f"a pod of namespace {ns}", netpol.Pod(ns, namespace_labels=pod_isolation.namespace_labels(inputs, ns)))
        for ns in [*namespaces, pod_isolation.USER_NAMESPACE]]
    sources += [(f"host address {a}", a) for a in pod_isolation.addresses_of_pools(inputs)]
    # the destination's side: a namespace that denies its own pods' egress (the balloons) chose so
    refused = [(f"{who} on {port}/{proto}", isinstance(source, netpol.Pod), str(proto).upper())
               for who, source in sources for port, proto in wanted
               if not netpol.admitted(found, netpol.Flow(source, pod, port, proto), egress=False)]
    if not refused:
        return []
    said = [who for who, _, _ in refused]
    # What breaks follows who is refused: pods refused, the line's own `breaks` (no name resolves
    # for them); host addresses alone, the line's `hostSourcesOnly.breaks`, but only while
    # kube-proxy keeps a pod's own address on its way to the DNS Service (hostSourcesOnly.kubeProxy).
    # And which protocol: TCP alone refused (UDP admitted for everyone), the line's `tcpOnly`: only
    # answers too large for UDP fail (CoreDNS truncates them, the TCP retry is what is refused),
    # for every pod (`breaks`) or for the host sources alone (`hostBreaks`, the same kube-proxy condition).
    breaks = _dns_breaks(inputs, value, {proto for _, is_pod, proto in refused if is_pod},
                         {proto for _, is_pod, proto in refused if not is_pod})
    return [_finding(name, contract, req, value["workload"], f"its NetworkPolicies refuse {'; '.join(said[:4])}"
                     + (f" and {len(said) - 4} more" if len(said) > 4 else ""),
                     "admit every source on those ports (kilonode.k8s.network_policy KUBE_SYSTEM_INGRESS)",
                     breaks=breaks)]


def _dns_breaks(inputs: Inputs, value: Mapping[str, Any], pods: set[str], hosts: set[str]) -> str | None:
    """What breaks, from the protocols refused to pods and to host addresses (None: the line's own
    `breaks`, no name resolves anywhere). Host addresses count apart from pods only while kube-proxy
    keeps a pod's own address (hostSourcesOnly); UDP refused is no lookup, TCP alone only the
    truncated answers' retries (tcpOnly)."""
    hosts_only = value.get("hostSourcesOnly") or {}
    tcp_only = value.get("tcpOnly") or {}
    apart = bool(hosts_only) and _keeps_pod_sources(inputs, hosts_only)
    if not apart:  # a host's refusal is a pod's too: one set of protocols for everyone
        pods, hosts = pods | hosts, set()
    if "UDP" in pods or (pods and not tcp_only):
        return None
    said = []
    if "UDP" in hosts or (hosts and not tcp_only):
        said.append(str(hosts_only["breaks"]))
    elif hosts and not pods:
        said.append(str(tcp_only.get("hostBreaks") or tcp_only["breaks"]))
    if pods:
        said.append(str(tcp_only["breaks"]))
    return "; and ".join(said) or None


def _keeps_pod_sources(inputs: Inputs, hosts_only: Mapping[str, Any]) -> bool:
    """Whether kube-proxy's rendered configuration (the line's `kubeProxy` ConfigMap, `key`) leaves a
    pod's own address on its packets to a ClusterIP: a mode among `modes` (nftables, iptables), no
    masqueradeAll, and local-traffic detection in `detectLocalMode`. Those proxiers masquerade traffic
    to a ClusterIP only when masqueradeAll is set, or when the detector calls it not local (the
    internal-traffic chain's `IfNotLocalNFT` jump to the masquerade mark: kubernetes/kubernetes
    pkg/proxy/nftables/proxier.go, and pkg/proxy/iptables/proxier.go's `IfNotLocal`); by interface
    prefix, traffic entering on a pod's host-side interface (`iifname azv*`) is local
    (pkg/proxy/util/localdetector.go NewDetectLocalByInterfaceNamePrefix). Unreadable or anything
    else: False, so the finding keeps the line's whole `breaks`."""
    _, config = _config_map_document(inputs, str(hosts_only["kubeProxy"]), str(hosts_only.get("key", "config.conf")))
    if not isinstance(config, Mapping):
        return False
    return (str(config.get("mode") or "") in set(hosts_only.get("modes") or [])
            and config.get("masqueradeAll") is not True
            and str(config.get("detectLocalMode") or "") in set(hosts_only.get("detectLocalMode") or []))


def _served_to_pools(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every pool's nodes reach the host-network workload's pods on the line's `port`: its container
    serves it, and the NSGs in front of every pool its pods may land on admit every pool's subnet."""
    callers = [(f"pool {p.name} ({p.subnet})", IPv4Network(p.subnet), "to ") for p in inputs.plan.node_pools]
    return _served_through_nsgs(inputs, name, contract, req, "where the contract has every node call it", callers,
                                "admit every pool subnet on {port}/TCP to the pools (kilonode.azure.network)")[2]


def _served_through_nsgs(inputs: Inputs, name: str, contract: Contract, req: Requirement, role: str,
                         callers: Sequence[tuple[str, IPv4Network, str]], fix: str,
                         ) -> tuple[Mapping[str, Any] | None, int, list[Finding]]:
    """The line's workload, its `port`, and the findings of the two checks every "served to" line
    shares: its container serves the port, and the NSGs in front of every pool its pods may land on
    (preflight's scheduling placement, with the pools whose GPU health taint must clear first) admit
    each caller (what it is called, its subnet, the words before the target subnet) on that port, as
    Azure evaluates a TCP flow (deployer_path `admits`). No workload: (None, port, [])."""
    value = req.value
    port = int(value["port"])
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return None, port, []
    container = _container(_pod_spec(workload), value["container"]) or {}
    if port not in {int(p.get("containerPort", 0)) for p in container.get("ports") or []}:
        return None, port, [_finding(name, contract, req, value["workload"], f"container {value['container']} "
                                     f"declares no port {port}, {role}",
                                     "serve the port the contract names, or read the contract again at the pinned tag")]
    groups = bootstrap_nodes(inputs)
    placed = scheduling.placement_of(workload, groups, [w for w in inputs.workloads() if w.kind == "DaemonSet"])
    graph, vnet = NetworkGraph(inputs), [IPv4Network(inputs.plan.network.vnet_cidr)]
    findings = []
    for group in (g for g in groups if g.host in {*placed.now, *placed.after_gpu_health}):
        address = next(IPv4Network(group.pool.subnet).hosts())  # any of the pool's: its NSGs are per subnet
        for caller, source, to in callers:
            for nsg in nsgs_of(graph, address):
                verdict, rule = admits(nsg.inputs.get("securityRules") or [], source, [address], port, vnet)
                if verdict != "allow":
                    findings.append(_finding(
                        name, contract, req, f"{value['workload']} on {group.host}",
                        f"{nsg.describe()} refuses {caller} on {port}/TCP {to}{group.pool.subnet} (rule {rule})",
                        fix.format(port=port)))
    return workload, port, findings


EVALUATORS: dict[str, Evaluator] = {
    "podNeeds": _pod_needs,
    "renderedSetting": _rendered_setting,
    "nodeSysctls": _node_sysctls,
    "cgroupV2": _cgroup_v2,
    "cgroupDriverMatchesKubelet": _cgroup_driver_matches_kubelet,
    "deviceAccessFromImageEnv": _device_access_from_image_env,
    "waitsForNodeMarker": _waits_for_node_marker,
    "hostNetworkOnIpBoundNodes": _host_network,
    "devCharLinks": _dev_char_links,
    "kernelOptionForSelector": _kernel_option_for_selector,
    "gpuDirectPath": _gpu_direct_path,
    "ncclJobEnvironment": _nccl_job_environment,
    "heldForRescan": _held_for_rescan,
    "waitsForFabricState": _waits_for_fabric_state,
    "rbacAllows": _rbac_allows,
    "discoveryRbac": _discovery_rbac,
    "configMapSetting": _config_map_setting,
    "crdPresent": _crd_present,
    "corefilePlugins": _corefile_plugins,
    "kernelAtLeast": _kernel_at_least,
    "azureRoleOnNodeGroups": _azure_role_on_node_groups,
    "azureRoleForDisks": _azure_role_for_disks,
    "apiserverFlags": _apiserver_flags,
    "servedToApiservers": _served_to_apiservers,
    "servedToPods": _served_to_pods,
    "servedToPools": _served_to_pools,
}
