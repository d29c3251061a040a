"""binaries: every program a role's files run is in its image; seeded breaks."""

from __future__ import annotations

import json
from typing import Any

from kilonode.node import ship
from kilonode.preflight import Finding, run
from kilonode.preflight.load import from_parts
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

CONFLIST = "etc/cni/net.d/10-azure.conflist"


def findings(stack: str, files: dict[str, str] | None = None, **kw: Any) -> list[Finding]:
    if kw:
        return run(from_parts(shared.plan(stack), files or {}, artefacts(stack)[1], **kw), ["binaries"])
    return run(inputs_of(stack, files=files), ["binaries"])


def broken(found: list[Finding], host: str) -> list[str]:
    return [f.what for f in found if f.level == "break" and f.where == host]


def test_the_shipped_stacks_only_warn_that_azure_cni_is_not_locked_yet(shipped: str) -> None:
    found = findings(shipped)
    assert [f for f in found if f.level == "break"] == []
    warned = [f for f in found if f.level == "warn"]
    assert warned and all(f.what.startswith("azure-cni 1.6.21 unverified: no digest yet; the first "
                                            "`kilonode image build --fetch` records it") for f in warned)


def _conflist(files: dict[str, str], host: str, edit: Any) -> None:
    conflist = json.loads(files[f"{host}/{CONFLIST}"])
    edit(conflist)
    files[f"{host}/{CONFLIST}"] = json.dumps(conflist)


def test_a_conflist_plugin_the_image_lacks_keeps_cri_dockerd_nodes_not_ready() -> None:
    files, _ = artefacts("research-7500")
    _conflist(files, "pool-h100-ib", lambda c: c["plugins"].append({"type": "bandwidth-shaper"}))
    [what] = broken(findings("research-7500", files), "pool-h100-ib")
    assert what.startswith("/opt/cni/bin/bandwidth-shaper (plugin type bandwidth-shaper in /etc/cni/net.d/")
    assert "every node of the pool stays NotReady" in what and "cni config uninitialized" in what


def test_a_conflist_plugin_the_image_lacks_leaves_containerd_pods_in_container_creating() -> None:
    files, _ = artefacts("research-2500")
    _conflist(files, "pool-nc-a100", lambda c: c["plugins"].append({"type": "bandwidth-shaper"}))
    [what] = broken(findings("research-2500", files), "pool-nc-a100")
    assert "the nodes go Ready, and every non-hostNetwork pod stays in ContainerCreating" in what


def test_a_missing_nested_ipam_plugin_is_ready_nodes_without_pod_networking() -> None:
    files, _ = artefacts("research-7500")
    _conflist(files, "pool-a100-ib", lambda c: c["plugins"][0]["ipam"].update(type="azure-vnet-ipam-v9"))
    [what] = broken(findings("research-7500", files), "pool-a100-ib")
    assert what.startswith("/opt/cni/bin/azure-vnet-ipam-v9 (plugin azure-vnet's ipam.type azure-vnet-ipam-v9")
    assert "the nodes go Ready but there is no pod networking" in what


def test_a_cni_version_a_plugin_does_not_accept_is_a_break() -> None:
    files, _ = artefacts("local")
    _conflist(files, "pool-cpu", lambda c: c.update(cniVersion="9.9.9"))
    what = broken(findings("local", files), "pool-cpu")
    assert any("asks for 9.9.9" in w and "stays NotReady" in w for w in what)


def test_a_unit_running_a_missing_binary_is_a_break() -> None:
    files, _ = artefacts("local")
    unit = "apiserver-0/etc/systemd/system/kube-apiserver.service"
    files[unit] = files[unit].replace("ExecStart=/usr/local/bin/kube-apiserver ",
                                      "ExecStart=/usr/local/bin/kube-apiserver2 ")
    [what] = broken(findings("local", files), "apiserver-0")
    assert what.startswith("/usr/local/bin/kube-apiserver2 (ExecStart in /etc/systemd/system/kube-apiserver.service)")
    assert "kube-apiserver.service cannot start" in what


def test_a_unit_running_a_python_script_no_image_carries_is_a_break() -> None:
    files, _ = artefacts("local")
    unit = "etcd-main-0/etc/systemd/system/kilonode-etcd-snapshot.service"
    files[unit] = files[unit].replace("/usr/local/lib/kilonode/etcd_snapshot.py", "/usr/local/lib/kilonode/snap.py")
    [what] = broken(findings("local", files), "etcd-main-0")
    assert what.startswith("/usr/local/lib/kilonode/snap.py (ExecStart script in "
                           "/etc/systemd/system/kilonode-etcd-snapshot.service) is not in the image")
    assert "python3 exits 2" in what


def test_a_node_program_left_out_of_the_pool_images_breaks_every_pool(monkeypatch: Any) -> None:
    """The image side: the pod traffic units are rendered, and ship.py no longer puts their
    program into the pool images."""
    monkeypatch.setattr(ship, "PROGRAMS", tuple(p for p in ship.PROGRAMS if p is not ship.POD_TRAFFIC))
    found = findings("local")
    [what, serve] = broken(found, "pool-cpu")
    assert what.startswith("/usr/local/lib/kilonode/pod-traffic (ExecStart script in "
                           "/etc/systemd/system/kilonode-pod-traffic.service) is not in the image")
    assert "kilonode-pod-traffic@.service" in serve
    assert [f for f in found if f.level == "break" and not f.where.startswith("pool-")] == []
    assert all("its row in kilonode/node/ship.py" in f.fix for f in found if f.level == "break")


def test_a_python_module_outside_the_units_pythonpath_is_a_break() -> None:
    files, _ = artefacts("research-2500")
    unit = "apiserver-0/etc/systemd/system/kilonode-node-client-approver.service"
    files[unit] = files[unit].replace("PYTHONPATH=/usr/local/lib/kilonode/approver", "PYTHONPATH=/usr/local/lib/x")
    [what] = broken(findings("research-2500", files), "apiserver-0")
    assert what.startswith("/usr/local/lib/x/node_client_approver/main.py (ExecStart module node_client_approver.main")


def test_cri_dockerd_needing_a_newer_docker_api_is_a_break(monkeypatch: Any) -> None:
    from kilonode.preflight.checks import binaries

    _, catalog = binaries._data()
    cri = catalog.components["cri-dockerd"]
    version = cri.pins[0].version
    monkeypatch.setitem(cri.docker_api, version, "1.42")
    found = findings("local")
    [what] = [w for w in broken(found, "pool-cpu") if "Docker Engine API" in w]
    assert f"cri-dockerd {version} needs Docker Engine API 1.42 or later" in what and "serves 1.41" in what


def test_an_unpinned_component_with_no_lock_has_no_delivery_path(monkeypatch: Any) -> None:
    from dataclasses import replace

    from kilonode.preflight.checks import binaries

    _, catalog = binaries._data()
    monkeypatch.setitem(catalog.components, "azure-cni", replace(catalog.components["azure-cni"], lock=False))
    what = broken(findings("local"), "pool-cpu")
    assert len(what) == 2  # azure-vnet and its ipam plugin
    assert "azure-cni 1.6.21: no delivery path (not pinned" in what[0]


def test_a_lock_entry_makes_it_verified(monkeypatch: Any) -> None:
    from kilonode.catalog.binaries import LockEntry
    from kilonode.preflight.checks import binaries

    _, catalog = binaries._data()
    entry = LockEntry("azure-cni", "1.6.21", catalog.arch, "https://example.invalid/x.tgz", "0" * 64,
                      "2026-01-01T00:00:00+00:00")
    monkeypatch.setitem(catalog.locked, entry.key(), entry)
    assert findings("local") == []


def test_a_built_image_without_the_binary_is_a_break_even_when_pinned() -> None:
    files, _ = artefacts("local")
    pool = shared.plan("local").node_pools[0]
    manifest = {"name": f"local-{pool.name}", "pool": pool.name, "binaries": [
        {"name": "kubelet", "path": "/usr/local/bin/kubelet", "present": False, "files": [],
         "origin": "absent: not downloaded (no --fetch)"}], "other_binaries": [], "artefacts": []}
    found = findings("local", files, images={manifest["name"]: manifest})
    [what] = broken(found, f"pool-{pool.name}")
    assert what.startswith("/usr/local/bin/kubelet (ExecStart in /etc/systemd/system/kubelet.service)")
    assert "absent: not downloaded" in what


def test_a_vhd_upload_keyed_by_its_path_is_a_break() -> None:
    from kilonode.preflight import breaks, run
    from tests.preflight.conftest import artefacts, inputs_of

    files, graph = artefacts("local")
    uploads = [r for r in graph["resources"] if r["type"] == "command:local:Command"
               and "az storage blob upload" in str(r["inputs"].get("create"))]
    assert uploads and all(r["inputs"]["triggers"][0] == "not-read" for r in uploads)
    assert not breaks(run(inputs_of("local", files=files, graph=graph), ["binaries"]))
    uploads[0]["inputs"]["triggers"] = [uploads[0]["inputs"]["environment"]["VHD"]]  # the old key: its path
    [finding] = breaks(run(inputs_of("local", files=files, graph=graph), ["binaries"]))
    assert finding.where == f"command:local:Command {uploads[0]['name']}"
    assert "an absent VHD is not caught" in finding.what


def test_a_vhd_upload_that_would_run_again_on_a_rebuilt_vhd_is_a_break() -> None:
    """The next build's VHD must never replace a published version's blob (its gallery version's
    source, or the rollback target's): each upload ignores later changes to its key and path."""
    from kilonode.preflight import breaks, run
    from tests.preflight.conftest import artefacts, inputs_of

    files, graph = artefacts("local")
    uploads = [r for r in graph["resources"] if r["type"] == "command:local:Command"
               and "az storage blob upload" in str(r["inputs"].get("create"))]
    assert uploads and all(set(r["ignoreChanges"]) == {"triggers", "environment"} for r in uploads)
    del uploads[0]["ignoreChanges"]
    [finding] = breaks(run(inputs_of("local", files=files, graph=graph), ["binaries"]))
    assert finding.where == f"command:local:Command {uploads[0]['name']}"
    assert "the next build's VHD would replace this version's blob" in finding.what


def test_built_images_missing_one_the_program_uploads_is_a_break() -> None:
    """With --images, each image of the plan's boot_images must be built: the runbook once built
    4 of research-7500's 6, and the program refuses the run before it creates anything."""
    files, _ = artefacts("research-7500")
    built = {f"research-7500-{name}": {"name": f"research-7500-{name}", "pool": name, "binaries": [],
                                       "other_binaries": [], "artefacts": []} for name in ("a100-ib", "h100-ib")}
    built |= {f"research-7500-{role}": {"name": f"research-7500-{role}", "role": role, "binaries": [],
                                        "other_binaries": [], "artefacts": []} for role in ("etcd", "control-plane")}
    found = {f.where: f.what for f in findings("research-7500", files, images=built) if f.where.startswith("image ")}
    assert sorted(found) == ["image monitoring", "image system"]
    assert found["image system"].startswith("the program uploads the pool image system, which the built images lack")


def test_a_graph_recorded_while_a_vhd_was_absent_is_a_break() -> None:
    from tests.preflight.conftest import inputs_of

    files, graph = artefacts("local")
    upload = next(r for r in graph["resources"] if r["type"] == "command:local:Command"
                  and "az storage blob upload" in str(r["inputs"].get("create")))
    upload["inputs"]["triggers"][0] = "absent"
    found = [f for f in run(inputs_of("local", files=files, graph=graph), ["binaries"]) if f.level == "break"]
    assert len(found) == 1 and "was not built when the program read it" in found[0].what
