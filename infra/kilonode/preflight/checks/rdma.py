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

Not yet traced (issue 23 continues), and said as a warning: whether a pod can reach the node's
InfiniBand devices at all (an RDMA device resource, `/dev/infiniband`, memlock), without which
NCCL falls back to TCP on the front-end NIC.
"""

from __future__ import annotations

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
    if any(p.infiniband for p in inputs.plan.node_pools):
        findings.append(Finding(
            NAME, "warn", "InfiniBand pools",
            "no RDMA device resource or /dev/infiniband in pods yet, no memlock limit raised: a gang's NCCL "
            "traffic goes over TCP on the front-end NIC, not InfiniBand",
            "issue 23 item 3 (RDMA into pods) is not done yet",
        ))
    return findings


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
