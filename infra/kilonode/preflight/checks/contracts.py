"""contracts: every third-party component's contract (catalog/contracts.yaml) against what the
cluster will really have.

A contract lists what a component needs from its node and cluster, each line read in its source
at the pinned version. This check evaluates every requirement by its `kind`, reading the
requirement's own `value` (the workload, the capability, the kernel option, the marker, the
minimum version): the code below knows how to judge a kind, never what a component needs. What it
judges against:

- the recorded graph: the workloads' pod specs (security contexts, init containers, volumes,
  host network), the RDMA plugin's ConfigMap;
- the render: each GPU pool host's kubelet configuration (its cgroup driver);
- what the pool's image carries: the recipe (kilonode.image.recipe: its packages, its kernel and
  the overlays' modules-load.d) and what the build writes (kilonode.image.gpu: the toolkit's
  settings, the device unit); with `--images`, the built manifest instead where it records it;
- the kernels' options (catalog/kernels.yaml, measured from Debian's packages).

A contract whose `version` is not the version pinned where its `pin` says was read at another
release: a break, since none of its lines can be trusted until someone reads them again.

The kinds, each judged by one function below: deviceAccessFromImageEnv (a container that gets
its devices through its image's env var: privileged, the capability added, or the image's
toolkit taking the variable from anyone), waitsForNodeMarker (an init container waiting for a
marker a unit of the image writes), hostNetworkOnIpBoundNodes, devCharLinks (where the kubelet's
cgroup driver is the named one, the image runs the named command in the named unit),
kernelOptionForSelector (a selector the component's config uses, the kernel option in the pool's
kernel, a module option loaded at boot), gpuDirectPath (the driver module, kernel options, the job
image's rdma-core and NCCL), waitsForFabricState (the agent's fabric wait on NVSwitch pools),
renderedSetting (a node program's rendered JSON setting on the pools named), podNeeds (a
workload's pod spec as upstream's manifest runs it: host network, container arguments).

Seeded breaks (tests/preflight/test_contracts.py), one per requirement used: the plugin without
SYS_ADMIN (and with the toolkit's env-var key true, the case that passes); no init container
waiting for the marker, and an image unit that writes another; the plugin off the host network;
the links unit missing from the image (and the cgroupfs driver, where the line does not apply);
a link-type selector on the cloud kernel, ib_ipoib not loaded at boot, and a selector that needs
no netdev (not judged); the proprietary module on an InfiniBand pool, an NCCL older than DMA-BUF
and a job image's old rdma-core (an unrecorded one is a warning); an agent told not to wait for
the fabric; an InfiniBand pool whose agent does not probe GPUDirect; the cloud provider's
workloads off the host network, and its controller configuring cloud routes under Azure CNI; a
stale contract version (and one read at every minor it names, which holds for each).
Held out, in a built image's manifest only (--images): a kernel without IPoIB, no devices unit, a
lenient toolkit, the proprietary module, no ib_ipoib at boot, an old rdma-core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import yaml

from kilonode.catalog import components as catalog_components
from kilonode.catalog.contracts import Contract, Requirement, contracts, kernels
from kilonode.image import gpu as image_gpu
from kilonode.image.recipe import Recipe, load_recipe
from kilonode.plan import wellknown
from kilonode.plan.model import NodePoolPlan
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "contracts"
TITLE = ("Component contracts: what each component needs from its node and cluster, read at the pinned "
         "version, against the plan, render, graph and images")

Evaluator = Callable[[Inputs, str, Contract, Requirement], list[Finding]]


@cache
def _recipe() -> Recipe:
    return load_recipe()


def check(inputs: Inputs) -> list[Finding]:
    findings: list[Finding] = []
    for name, contract in contracts().items():
        stale = _stale(inputs, name, contract)
        if stale:
            findings.append(stale)
            continue
        for requirement in contract.requirements:
            findings += EVALUATORS[requirement.kind](inputs, name, contract, requirement)
    return findings


def _finding(name: str, contract: Contract, req: Requirement, where: str, here: str, fix: str,
             level: str = "break") -> Finding:
    """What the finding says: the component and line, what violates it here, what breaks, the sources."""
    return Finding(
        NAME, level, where,  # type: ignore[arg-type]  # "break" or "warn"
        f"{contract.component} {contract.version}, contract line {name}/{req.id}: {here}. {req.breaks}. "
        f"The contract: {req.what} (source: {req.source[0]}"
        + (f"; {len(req.source) - 1} more in catalog/contracts.yaml {name}/{req.id})" if len(req.source) > 1 else ")"),
        fix,
    )


# --- the contract's version against its pin -----------------------------------------------------


def pinned_version(pin: str, kubernetes_version: str) -> str | None:
    """The version pinned where `pin` says: a components.yaml key, `recipe:<package>` (the exact
    version the recipe declares for any image), or `kilonode` (our own program: always current)."""
    if pin == "kilonode":
        return "kilonode"
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


def _stale(inputs: Inputs, name: str, contract: Contract) -> Finding | None:
    pinned = pinned_version(contract.pin, inputs.plan.kubernetes_version)
    if pinned in {contract.version, *contract.also_read_at} or (pinned is None and contract.pin.startswith("recipe:")):
        # a package no image declares: its requirements say what is missing, line by line
        return None
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
            kubelet = inputs.host_files(host).get("etc/kubernetes/kubelet-config.yaml")
            driver = (yaml.safe_load(kubelet) or {}).get("cgroupDriver", "cgroupfs") if kubelet else None
            if driver != value["whenCgroupDriver"]:
                continue
            path, exec_lines, whose = _devices_unit(inputs, pool)
            if path and path.endswith(f"/{value['unit']}") and any(value["command"] in line for line in exec_lines):
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: image",
                f"the kubelet's cgroup driver is {driver} and {whose} runs no `{value['command']}` "
                f"({value['unit']}: {path or 'absent'})",
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


# Which pools a renderedSetting line names: a predicate on the plan's pool.
POOL_SETS: dict[str, Callable[[NodePoolPlan], bool]] = {
    "gpu": lambda p: p.gpus_per_node > 0,
    "infiniband-gpu": lambda p: p.gpus_per_node > 0 and p.infiniband,
    "nvswitch": lambda p: p.gpus_per_node > 0 and p.nvswitch,
}


def _rendered_setting(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """Every host of the named pools has the rendered JSON file with the key at the value."""
    value = req.value
    findings = []
    for pool in (p for p in inputs.plan.node_pools if POOL_SETS[value["pools"]](p)):
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            text = inputs.host_files(host).get(str(value["config"]).lstrip("/"))
            have = json.loads(text).get(value["key"]) if text else None
            if have == value["equals"]:
                continue
            findings.append(_finding(
                name, contract, req, f"{host}: {value['config']}",
                f"{value['key']} is {have!r} there" if text else f"the host has no {value['config']}",
                f"render {value['key']}: {json.dumps(value['equals'])} for these pools (kilonode.render.pool)"))
    return findings


def _pod_needs(inputs: Inputs, name: str, contract: Contract, req: Requirement) -> list[Finding]:
    """The workload's pod spec holds what the line names: `hostNetwork`, a container's `args`, its
    `privileged`, and `hostPaths` mounted into it."""
    value = req.value
    workload = _workload(inputs, value["workload"])
    if workload is None:
        return []  # not deployed by this stack: nothing to judge
    spec = _pod_spec(workload)
    problems = []
    if "hostNetwork" in value and bool(spec.get("hostNetwork")) != value["hostNetwork"]:
        problems.append(f"hostNetwork is {bool(spec.get('hostNetwork'))}, not {value['hostNetwork']}")
    container = next((c for c in spec.get("containers") or [] if c.get("name") == value.get("container")), {})
    if "args" in value:
        words = [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]
        problems += [f"container {value.get('container')} runs without {arg}" for arg in value["args"]
                     if arg not in words]
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    if "privileged" in value and privileged != value["privileged"]:
        problems.append(f"container {value.get('container')} is not privileged" if value["privileged"]
                        else f"container {value.get('container')} is privileged")
    if "hostPaths" in value:
        host = {v.get("name"): (v.get("hostPath") or {}).get("path") for v in spec.get("volumes") or []}
        mounted = {host.get(m.get("name")) for m in container.get("volumeMounts") or []}
        problems += [f"container {value.get('container')} does not mount the host's {path}"
                     for path in value["hostPaths"] if path not in mounted]
    if not problems:
        return []
    return [_finding(name, contract, req, value["workload"], "; ".join(problems),
                     "give the workload what upstream's manifest gives it (the contract's source)")]


EVALUATORS: dict[str, Evaluator] = {
    "podNeeds": _pod_needs,
    "renderedSetting": _rendered_setting,
    "deviceAccessFromImageEnv": _device_access_from_image_env,
    "waitsForNodeMarker": _waits_for_node_marker,
    "hostNetworkOnIpBoundNodes": _host_network,
    "devCharLinks": _dev_char_links,
    "kernelOptionForSelector": _kernel_option_for_selector,
    "gpuDirectPath": _gpu_direct_path,
    "waitsForFabricState": _waits_for_fabric_state,
}
