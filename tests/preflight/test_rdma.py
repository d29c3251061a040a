"""rdma: research-7500's InfiniBand nodes each name their fabric, register rdma/ib and let
containers pin memory; each seeded break in those chains (no label, an optional or unwritten
environment file, a kubelet that does not wait for the writer, no rdma/ib, memlock left at its
default) is named under the check."""

from __future__ import annotations

import json

import pytest

from kilonode.preflight import breaks, run
from tests.preflight.conftest import artefacts, inputs_of

CHECK = ["rdma"]
KUBELET = "pool-h100-ib/etc/systemd/system/kubelet.service"


def found(files: dict[str, str]) -> list[tuple[str, str]]:
    _, graph = artefacts("research-7500")
    return [(f.where, f.what) for f in breaks(run(inputs_of("research-7500", files=files, graph=graph), CHECK))]


def test_the_shipped_ib_pools_reach_their_hcas() -> None:
    # GPUDirect RDMA is a contract line now (tests/preflight/test_contracts.py), not a warning here
    assert run(inputs_of("research-7500"), CHECK) == []
    assert run(inputs_of("local"), CHECK) == []  # no InfiniBand: nothing to say


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda text: text.replace(",kilonode.io/fabric=${KILONODE_FABRIC}", ""), "register no kilonode.io/fabric"),
    (lambda text: text.replace("EnvironmentFile=/run", "EnvironmentFile=-/run"), "is optional"),
    (lambda text: text.replace("Requires=kilonode-fabric-label.service\n", ""), "neither Requires= nor"),
    (lambda text: text.replace("EnvironmentFile=/run/kilonode/fabric.env\n", ""), "from no EnvironmentFile"),
])
def test_a_broken_link_of_the_fabric_label_is_a_break(plant: object, expected: str) -> None:
    files, _ = artefacts("research-7500")
    planted = plant(files[KUBELET])  # type: ignore[operator]
    assert planted != files[KUBELET]
    files[KUBELET] = planted
    [(where, what)] = found(files)
    assert where == "pool-h100-ib: kubelet" and expected in what


def test_a_fabric_script_the_render_lacks_is_a_break() -> None:
    files, _ = artefacts("research-7500")
    del files["pool-h100-ib/usr/local/lib/kilonode/fabric-label"]
    [(_, what)] = found(files)
    assert "which the render does not write" in what


def test_memlock_left_at_its_default_is_a_break() -> None:
    files, _ = artefacts("research-7500")
    key = "pool-a100-ib.team-vision/etc/docker/daemon.json"
    config = json.loads(files[key])
    del config["default-ulimits"]
    files[key] = json.dumps(config)
    [(where, what)] = found(files)
    assert where == "pool-a100-ib.team-vision: etc/docker/daemon.json" and "64 KiB memlock" in what


def test_no_daemonset_registering_rdma_ib_is_a_break() -> None:
    files, graph = artefacts("research-7500")
    [config] = [r for r in graph["resources"] if r["type"] == "kubernetes:core/v1:ConfigMap"
                and r["inputs"]["metadata"]["name"] == "rdma-devices"]
    config["inputs"]["data"]["config.json"] = config["inputs"]["data"]["config.json"].replace('"ib"', '"hca"')
    [finding] = breaks(run(inputs_of("research-7500", files=files, graph=graph), CHECK))
    assert finding.where == "InfiniBand pools" and "no DaemonSet of the graph registers rdma/ib" in finding.what
