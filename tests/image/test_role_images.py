"""The control plane's images, built by the node-image pipeline: `kilonode image build --role
etcd` and `--role control-plane`.

The etcd image is built, read offline, and booted once with an etcd member's own rendered
user-data (the path Azure's custom data takes): cloud-init must finish without installing
anything (a control-plane VM never depends on a download at boot), the data disk must be
mounted where the unit wants it, and etcd.service must be skipped, not failed, because the
pinned etcd 3.5 release cannot be downloaded here (the manifest says so). The node programs
the members' units run (the snapshot job, the certificate expiry program) are the image's. The rendered etcd
flags themselves run on real etcd in tests/render/test_etcd_real.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kilonode.cli.image import image_inputs
from kilonode.image.build import BuildResult, build_image
from kilonode.image.disk import ImageFs
from kilonode.image.manifest import Manifest
from kilonode.image.qemu import Vm, VmConfig
from kilonode.image.seed import make_keypair, make_seed, meta_data
from kilonode.image.verify import DEFAULT_USER
from kilonode.node.ship import CERT_EXPIRY, ETCD_SNAPSHOT, NODE_CLIENT_APPROVER, POD_TRAFFIC
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan
from kilonode.render import USER_DATA, cert_metrics, render_cluster
from kilonode.render import etcd_snapshot as snapshot
from tests.conftest import module_workdir

pytestmark = pytest.mark.slow

RUNTIME_PACKAGES = {"docker.io", "containerd", "runc", "etcd-server", "etcd-client"}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_workdir(tmp_path_factory, "role-images")


@pytest.fixture(scope="module")
def etcd_image(work: Path) -> BuildResult:
    return build_image(image_inputs("local", None, "etcd"), work / "etcd", allow_incomplete=True)


@pytest.fixture(scope="module")
def control_plane_image(work: Path) -> BuildResult:
    return build_image(image_inputs("local", None, "control-plane"), work / "control-plane", allow_incomplete=True)


def binaries(manifest: Manifest) -> dict[str, dict[str, object]]:
    return {b["name"]: b for b in [*manifest.binaries, *manifest.data["other_binaries"]]}


def test_the_etcd_image_carries_the_etcd_role_and_no_pool_software(etcd_image: BuildResult) -> None:
    manifest = Manifest.load(etcd_image.manifest)
    assert etcd_image.raw.name == "local-etcd.raw" and etcd_image.user_data is None
    assert manifest.data["role"] == "etcd" and manifest.data["pool"] is None
    assert manifest.data["inputs"]["flavour"] == "control"
    assert not RUNTIME_PACKAGES & set(manifest.data["packages"]), "the control flavour installs no runtime"
    etcd = binaries(manifest)["etcd"]
    assert set(binaries(manifest)) == {"etcd"} and etcd["unit"] == "etcd.service"
    # here it cannot be downloaded: absent, with the way to get it
    assert etcd["present"] is False and etcd["version"] == "3.5.33"
    assert "pass --fetch to download https://github.com/etcd-io/etcd/releases/download/v3.5.33/" in str(etcd["origin"])
    assert {a["path"] for a in manifest.artefacts if a["source"] == "recipe:etcd"} == {
        "/usr/lib/sysusers.d/kilonode-etcd.conf"
    }
    # the node programs its members' units run (kilonode.node.ship), executable, byte for byte
    fs = ImageFs(etcd_image.raw)
    for program in (ETCD_SNAPSHOT, CERT_EXPIRY):
        [(path, data, mode)] = program.files()
        [entry] = [a for a in manifest.artefacts if a["path"] == path]
        assert entry["source"] == f"node:{program.source}" and entry["mode"] == f"{mode:04o}" == "0755"
        assert fs.read(path) == data, path
    assert not {a["path"] for a in manifest.artefacts} & {POD_TRAFFIC.machine_path, NODE_CLIENT_APPROVER.machine_path}


def test_the_etcd_image_has_the_etcd_user_and_its_hygiene(etcd_image: BuildResult) -> None:
    fs = ImageFs(etcd_image.raw)
    passwd = {line.split(":")[0]: line.split(":") for line in (fs.read_text("/etc/passwd") or "").splitlines()}
    assert "etcd" in passwd, "the etcd unit runs as etcd: the image must carry the user"
    assert passwd["etcd"][6] == "/usr/sbin/nologin" and int(passwd["etcd"][2]) < 1000
    group = {line.split(":")[0] for line in (fs.read_text("/etc/group") or "").splitlines()}
    assert "etcd" in group
    assert fs.read("/etc/machine-id") == b""
    assert not [n for n in fs.listdir("/etc/ssh") if n.startswith("ssh_host_")]


def test_the_control_plane_image_carries_the_server_binaries_role(control_plane_image: BuildResult) -> None:
    manifest = Manifest.load(control_plane_image.manifest)
    assert manifest.data["role"] == "control-plane" and manifest.data["inputs"]["flavour"] == "control"
    found = binaries(manifest)
    assert set(found) == {"kubernetes-server", "kubectl"}
    assert found["kubernetes-server"]["unit"] == "kube-apiserver.service"
    assert found["kubernetes-server"]["version"] == "1.34.2" and found["kubernetes-server"]["present"] is False
    assert "etcd" not in (ImageFs(control_plane_image.raw).read_text("/etc/passwd") or "")
    # the certificate expiry program its cert-metrics unit runs, and not the etcd members' snapshot job
    paths = {a["path"] for a in manifest.artefacts}
    assert CERT_EXPIRY.machine_path in paths and ETCD_SNAPSHOT.machine_path not in paths
    assert ImageFs(control_plane_image.raw).read(CERT_EXPIRY.machine_path) == CERT_EXPIRY.path.read_bytes()
    # both roles share one cached base: the same package set
    assert not RUNTIME_PACKAGES & set(manifest.data["packages"])


def test_verify_refuses_a_role_image_saying_what_checks_it(etcd_image: BuildResult, work: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kilonode.cli", "image", "verify", str(etcd_image.raw), "--workdir",
         str(work / "verify-etcd")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2
    assert "is the etcd image: verify boots node pool images" in " ".join(result.stderr.split())


def test_an_etcd_member_boots_the_etcd_image_with_nothing_downloaded(
    etcd_image: BuildResult, work: Path, plans: dict[str, ClusterPlan]
) -> None:
    plan = plans["local"]
    member = plan.etcd_main.members[0]
    user_data = render_cluster(plan)[member.name][USER_DATA].content
    assert "packages:" not in user_data, "the member's cloud-init installs nothing"
    boot = work / "boot-etcd"
    boot.mkdir()
    key_file, public_key = make_keypair(boot)
    seed = make_seed(boot / "seed.img", user_data, meta_data(public_key, member.vm_name))
    config = VmConfig(image=etcd_image.raw, seed=seed, workdir=boot, user=DEFAULT_USER, key_file=key_file)
    with Vm(config) as vm:
        vm.wait_ssh()
        vm.wait_settled()

        def run(command: str) -> str:
            rc, output = vm.run(f"sudo {command}")
            assert rc == 0, f"`{command}` exited {rc}: {output}"
            return output.strip()

        # cloud-init ran the member's whole user-data without an error (`status` exits 1 on one)
        assert run("cloud-init status --long").splitlines()[0] == "status: done"
        # the data dir's disk is the local SSD (2,500-node post), mounted where the unit needs it
        mount = plan.etcd_main.local_disk.mount_point
        assert run(f"findmnt -n -o SOURCE {mount}") == "/dev/vdb"
        # skipped, not failed, with the reason systemd gives: the binary the image lacks here
        # (built --allow-incomplete)
        show = dict(
            line.split("=", 1) for line in run(
                "systemctl show etcd.service -p ActiveState -p Result -p ConditionResult -p UnitFileState"
            ).splitlines()
        )
        assert show == {"ActiveState": "inactive", "Result": "success", "ConditionResult": "no",
                        "UnitFileState": "enabled"}, show
        journal = run("journalctl -b -u etcd.service --no-pager")
        assert "skipped because of an unmet condition check (ConditionPathExists=/usr/local/bin/etcd)" in journal
        assert run("id -u etcd").isdigit()
        # the snapshot job and the certificate expiry program come with the image, not the custom
        # data: its timer is started, and both run under the image's python3 with the rendered config
        assert run(f"systemctl is-enabled {snapshot.TIMER}") == "enabled"
        assert run(f"systemctl is-active {snapshot.TIMER}") == "active"
        assert "--config" in run(f"/usr/bin/python3 {ETCD_SNAPSHOT.machine_path} --help")
        # no certificates were delivered here (no Azure): each file is reported unreadable, never silent
        answer = run(f"/usr/bin/python3 {CERT_EXPIRY.machine_path} --print --config /{cert_metrics.CONFIG_PATH}")
        assert f'kilonode_certificate_unreadable{{host="{member.name}"' in answer, answer
        rc, _ = vm.run("dpkg-query -W etcd-server")
        assert rc != 0, "etcd-server was installed at boot"
