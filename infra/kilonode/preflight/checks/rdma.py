"""rdma: an InfiniBand pool's nodes can carry a gang's NCCL traffic over their fabric.

On Azure an InfiniBand fabric is one scale set: RDMA reaches only the VMs of the same scale set
(kilonode.review.rules INFINIBAND_SCALE_SET_MAX: at most 100 VMs each). A gang must therefore
be placed inside one scale set, which the scheduler can do only if each node says which one it
is in. Traced from the render, for every InfiniBand pool role:

1. the kubelet registers `kilonode.io/fabric` (its `--node-labels`), its value from the
   environment systemd gives it (`${KILONODE_FABRIC}`);
2. that variable comes from an `EnvironmentFile=` without "-" (a missing file fails the kubelet
   rather than registering an unlabelled node), written by a unit the kubelet `Requires=` and
   starts `After=`, running a script the render writes for the role.

3. a pod can reach the node's InfiniBand devices: a DaemonSet of the graph registers the RDMA
   resource (`rdma/ib`: the shared device plugin's config names resource `ib`, prefix `rdma`,
   kilonode.k8s.rdma) and is meant for the pool (the `scheduling` check says whether it can be
   placed there);
4. a container may pin memory for RDMA: memlock unlimited, by Docker's daemon.json
   `default-ulimits` (Docker pools) or the runtime unit's `LimitMEMLOCK=infinity` (containerd
   pools, whose CRI sets no memlock of its own). With the default 64 KiB, ibv_reg_mr fails and
   NCCL falls back to sockets on the front-end NIC.

GPUDirect RDMA (the HCA reading GPU memory directly) and whether the HCAs register at all on the
image's kernel are contract lines (catalog/contracts.yaml gpuDirectRdma, rdmaSharedDevicePlugin),
judged by the `contracts` check: a pool without the DMA-BUF path is a break there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from kilonode.plan import wellknown
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import KUBELET_UNIT, bootstrap_nodes

NAME = "rdma"
TITLE = "InfiniBand pools: each node names its fabric (scale set) for gang placement; pods' RDMA path"

UNIT_DIR = "etc/systemd/system/"


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    for group in bootstrap_nodes(inputs):
        if not group.pool.infiniband:
            continue
        findings += _fabric_label(inputs, group.host, group.node.labels.get(wellknown.FABRIC_LABEL))
        findings += _memlock(inputs.host_files(group.host), group.host)
    infiniband = [p.name for p in inputs.plan.node_pools if p.infiniband]
    if infiniband:
        findings += _rdma_resource(inputs, infiniband)
    return findings


MEMLOCK_UNLIMITED = re.compile(r"^LimitMEMLOCK=infinity$", re.M)


def _memlock(files: Mapping[str, str], host: str) -> list[Finding]:
    """Containers may pin memory: Docker's default-ulimits, or the runtime unit's own limit."""
    daemon = files.get("etc/docker/daemon.json")
    if daemon is not None:
        memlock = (json.loads(daemon).get("default-ulimits") or {}).get("memlock") or {}
        if memlock.get("Hard") == -1 and memlock.get("Soft") == -1:
            return []
        where, fix = "etc/docker/daemon.json", 'daemon.json "default-ulimits": {"memlock": {"Hard": -1, "Soft": -1}}'
    else:
        dropins = [t for path, t in files.items() if path.startswith(f"{UNIT_DIR}containerd.service.d/")]
        if any(MEMLOCK_UNLIMITED.search(t) for t in dropins):
            return []
        where, fix = "containerd.service", "a containerd.service drop-in with LimitMEMLOCK=infinity"
    return [Finding(
        NAME, "break", f"{host}: {where}",
        "containers keep the default 64 KiB memlock limit: RDMA cannot register (pin) NCCL's buffers, and NCCL "
        "falls back to sockets on the front-end NIC",
        f"give {fix} (kilonode.render.pool)",
    )]


def _rdma_resource(inputs: Inputs, pools: list[str]) -> list[Finding]:
    """A DaemonSet registers rdma/ib: its config (a ConfigMap it mounts) names the resource."""
    configs = {}
    for r in inputs.of_type("kubernetes:core/v1:ConfigMap"):
        text = (r.inputs.get("data") or {}).get("config.json")
        meta = r.inputs.get("metadata") or {}
        if isinstance(text, str) and "configList" in text:
            configs[(meta.get("namespace"), meta.get("name"))] = json.loads(text)
    for ds in inputs.of_type("kubernetes:apps/v1:DaemonSet"):
        namespace = (ds.inputs.get("metadata") or {}).get("namespace")
        spec = ((ds.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        for volume in spec.get("volumes") or []:
            config = configs.get((namespace, (volume.get("configMap") or {}).get("name")))
            names = [f"{c.get('resourcePrefix') or 'rdma'}/{c.get('resourceName')}"
                     for c in (config or {}).get("configList", [])]
            if wellknown.RDMA_RESOURCE in names:
                return []
    return [Finding(
        NAME, "break", "InfiniBand pools",
        f"no DaemonSet of the graph registers {wellknown.RDMA_RESOURCE}: a pod cannot ask for the node's InfiniBand "
        f"devices ({', '.join(pools)}), /dev/infiniband is not in its containers, and NCCL falls back to sockets",
        "deploy the RDMA shared device plugin on the InfiniBand pools (kilonode.k8s.rdma)",
    )]


def _fabric_label(inputs: Inputs, host: str, value: str | None) -> list[Finding]:
    variable = f"${{{wellknown.FABRIC_ENV_VAR}}}"
    if value != variable:
        return [Finding(
            NAME, "break", f"{host}: kubelet",
            f"its nodes register {wellknown.FABRIC_LABEL}={value}" if value else
            f"its nodes register no {wellknown.FABRIC_LABEL} label: no gang can be kept inside one InfiniBand "
            "fabric, and a gang spread over two scale sets cannot use RDMA between them",
            f"register {wellknown.FABRIC_LABEL}={variable} in the kubelet's --node-labels (kilonode.render.pool)",
        )]
    files = inputs.host_files(host)
    kubelet = files.get(KUBELET_UNIT, "")
    env_files = re.findall(r"^EnvironmentFile=(-?)(\S+)$", kubelet, re.M)
    required = set(re.findall(r"^Requires=(.+)$", kubelet, re.M))
    after = " ".join(re.findall(r"^After=(.+)$", kubelet, re.M)).split()
    required = {unit for line in required for unit in line.split()}
    for optional, path in env_files:
        writers = [name for name, text in _units(files).items()
                   if re.search(rf"^ExecStart=\S+.*\s{re.escape(path)}$", text, re.M)]
        if optional:
            reason = f"EnvironmentFile=-{path} is optional: a node whose file is missing registers an unlabelled node"
        elif not writers:
            reason = f"no unit of the role writes {path}"
        elif not any(w in required and w in after for w in writers):
            reason = f"the kubelet neither Requires= nor starts After= {writers[0]}, which writes {path}"
        else:
            script = _script_of(files[f"{UNIT_DIR}{writers[0]}"])
            if script and script.lstrip("/") not in files:
                reason = f"{writers[0]} runs {script}, which the render does not write"
            else:
                return []
        return [Finding(NAME, "break", f"{host}: kubelet",
                        f"{variable} in --node-labels may be empty or stale: {reason}",
                        "keep the fabric-label unit and the kubelet's EnvironmentFile/Requires/After as "
                        "kilonode.render.pool writes them")]
    return [Finding(NAME, "break", f"{host}: kubelet",
                    f"{variable} in --node-labels comes from no EnvironmentFile: systemd leaves it empty and every "
                    f"node registers {wellknown.FABRIC_LABEL}= (no fabric)",
                    f"give the kubelet EnvironmentFile={wellknown.FABRIC_ENV_FILE} written by the fabric-label unit")]


def _units(files: Mapping[str, str]) -> dict[str, str]:
    return {path.removeprefix(UNIT_DIR): text for path, text in files.items()
            if path.startswith(UNIT_DIR) and path.endswith(".service")}


def _script_of(unit: str) -> str | None:
    found = re.search(r"^ExecStart=(\S+)", unit, re.M)
    return found.group(1) if found else None
