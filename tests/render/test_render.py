"""What each role's rendered files promise a user, read back from the files themselves."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.render import USER_DATA, render_cluster, render_tree
from kilonode.render.write import MARKER, OutputDirError, write_tree
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

runner = CliRunner()


def flags_of(unit: str) -> dict[str, str]:
    return dict(re.findall(r"--([a-z0-9-]+)=(\S+)", unit))


def sysctls_of(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


@pytest.fixture(scope="module")
def rendered_7500(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("render") / "research-7500"
    result = runner.invoke(app, ["render", "research-7500", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_research_7500_renders_one_directory_per_host_role(rendered_7500: Path) -> None:
    names = sorted(p.name for p in rendered_7500.iterdir() if p.is_dir())
    assert [n for n in names if n.startswith("etcd-main-")] == [f"etcd-main-{i}" for i in range(5)]
    assert [n for n in names if n.startswith("etcd-events-")] == [f"etcd-events-{i}" for i in range(3)]
    assert [n for n in names if n.startswith("apiserver-")] == [f"apiserver-{i}" for i in range(5)]
    assert [n for n in names if n.startswith("pool-")] == [
        "pool-a100-ib", "pool-a100-ib.team-language", "pool-a100-ib.team-vision", "pool-h100-ib", "pool-monitoring",
        "pool-system"]
    assert (rendered_7500 / "config.yaml").is_file() and (rendered_7500 / "plan.yaml").is_file()


def test_every_etcd_member_has_the_raised_quota_and_local_ssd_data(rendered_7500: Path) -> None:
    members = sorted(rendered_7500.glob("etcd-*/etc/systemd/system/etcd.service"))
    assert len(members) == 8
    for unit in members:
        flags = flags_of(unit.read_text())
        assert flags["quota-backend-bytes"] == "8589934592"
        assert flags["data-dir"] == "/mnt/local-ssd/etcd"
        assert flags["client-cert-auth"] == "true" and flags["peer-client-cert-auth"] == "true"
        assert flags["auto-tls"] == "false" and flags["peer-auto-tls"] == "false"
        assert flags["listen-client-urls"].startswith("https://")


def test_etcd_initial_cluster_lists_its_own_members_only(rendered_7500: Path, plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    for cluster in plan.etcd_clusters:
        for member in cluster.members:
            flags = flags_of((rendered_7500 / member.name / "etc/systemd/system/etcd.service").read_text())
            peers = dict(entry.split("=", 1) for entry in flags["initial-cluster"].split(","))
            assert set(peers) == {m.name for m in cluster.members}
            assert flags["name"] == member.name
            assert flags["initial-cluster-token"] == cluster.token


def test_every_apiserver_sends_events_to_all_events_members(rendered_7500: Path, plans: dict[str, ClusterPlan]) -> None:
    events = [m.ip for m in plans["research-7500"].etcd_events.members]
    units = sorted(rendered_7500.glob("apiserver-*/etc/systemd/system/kube-apiserver.service"))
    assert len(units) == 5
    for unit in units:
        flags = flags_of(unit.read_text())
        override = flags["etcd-servers-overrides"]
        assert override.startswith("/events#")
        assert override.removeprefix("/events#").split(";") == [f"https://{ip}:2379" for ip in events]
        assert "anonymous-auth" not in flags  # the authentication config decides, below
        auth = yaml.safe_load((unit.parents[3] / flags["authentication-config"].lstrip("/")).read_text())
        assert auth["apiVersion"] == "apiserver.config.k8s.io/v1"  # research-7500 runs 1.34
        assert auth["anonymous"] == {
            "enabled": True, "conditions": [{"path": "/healthz"}, {"path": "/livez"}, {"path": "/readyz"}]
        }
        assert flags["authorization-mode"] == "Node,RBAC"
        assert flags["endpoint-reconciler-type"] == "lease"
        audit = (flags["audit-log-maxage"], flags["audit-log-maxbackup"], flags["audit-log-maxsize"])
        # on the 1,200 GiB temp disk of Standard_D32ds_v5: half of it in 100 MB files, less the live one
        assert audit == ("30", str(1200 * 1024 // 2 // 100 - 1), "100")
        assert flags["audit-log-path"] == "/mnt/local-ssd/kubernetes/audit/audit.log"


def test_scheduler_packs_nodes_with_most_allocated(rendered_7500: Path) -> None:
    config = yaml.safe_load((rendered_7500 / "apiserver-0/etc/kubernetes/kube-scheduler-config.yaml").read_text())
    [profile] = config["profiles"]
    [fit] = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    assert fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"


@pytest.mark.parametrize("pool", ["pool-a100-ib", "pool-h100-ib"])
def test_every_docker_pool_carries_the_field_lessons(rendered_7500: Path, pool: str) -> None:
    root = rendered_7500 / pool
    sysctls = sysctls_of((root / "etc/sysctl.d/90-kilonode.conf").read_text())
    gc = [sysctls[f"net.ipv4.neigh.default.gc_thresh{i}"] for i in (1, 2, 3)]
    assert gc == ["80000", "90000", "100000"]
    kubelet = yaml.safe_load((root / "etc/kubernetes/kubelet-config.yaml").read_text())
    assert kubelet["serializeImagePulls"] is False
    assert kubelet["readOnlyPort"] == 0 and kubelet["authentication"]["anonymous"]["enabled"] is False
    # pod IPs, and kube-proxy, cloud-node-manager, calico-node, node-exporter, the two device plugins and
    # dcgm-exporter
    assert kubelet["maxPods"] == 3 + 7
    daemon = json.loads((root / "etc/docker/daemon.json").read_text())
    assert daemon["max-concurrent-downloads"] == 10
    assert daemon["storage-driver"] == "overlay2"
    assert daemon["data-root"].startswith("/mnt/local-ssd/")
    preload = json.loads((root / "etc/kilonode/preload-images.json").read_text())
    cri = flags_of((root / "etc/systemd/system/cri-docker.service").read_text())
    assert cri["pod-infra-container-image"] in [entry["image"] for entry in preload]
    assert cri["image-pull-progress-deadline"] == "30m"
    loader = (root / "usr/local/lib/kilonode/load-preloaded-images").read_text()
    assert all(entry["path"] in loader for entry in preload)


def test_containerd_pool_config(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-2500"]
    files = shared.rendered("research-2500")["pool-nc-a100"]
    assert "etc/docker/daemon.json" not in files
    config = tomllib.loads(files["etc/containerd/config.toml"].content)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert config["root"] == "/mnt/local-ssd/containerd"
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert cri["max_concurrent_downloads"] == 10
    assert cri["image_pull_progress_timeout"] == "30m"
    assert cri["sandbox_image"] == plan.node_pools[0].preload_images[0].image
    kubelet = yaml.safe_load(files["etc/kubernetes/kubelet-config.yaml"].content)
    assert kubelet["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert "containerd.service" in files["etc/systemd/system/kilonode-preload-images.service"].content


def test_user_data_writes_every_artefact_and_mounts_the_local_ssd() -> None:
    for files in shared.rendered("local").values():
        text = files[USER_DATA].content
        assert text.startswith("#cloud-config\n")
        data = yaml.safe_load(text)
        written = {entry["path"].lstrip("/"): entry["content"] for entry in data["write_files"]}
        assert written == {path: f.content for path, f in files.items() if path != USER_DATA}
        assert data["mounts"][0][:2] == ["/dev/vdb", "/mnt/local-ssd"]
        assert "nofail" in data["mounts"][0][3]


def test_pool_user_data_makes_sysctls_live_on_first_boot() -> None:
    data = yaml.safe_load(shared.rendered("local")["pool-cpu"][USER_DATA].content)
    assert data["runcmd"][0] == ["sysctl", "--system"]


def test_executable_files_keep_their_mode(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "local", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    loader = tmp_path / "out/pool-cpu/usr/local/lib/kilonode/load-preloaded-images"
    assert loader.stat().st_mode & 0o777 == 0o755


def test_rendering_twice_gives_byte_identical_trees(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert runner.invoke(app, ["render", "research-7500", "--out", str(tmp_path / name)]).exit_code == 0
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files_a)


def test_render_replaces_a_previous_render_of_the_same_stack(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(app, ["render", "research-7500", "--out", str(out)]).exit_code == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["tool"] == "kilonode render" and marker["stack"] == "research-7500"
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {MARKER}
    assert set(marker["files"]) == written
    assert runner.invoke(app, ["render", "research-7500", "--out", str(out)]).exit_code == 0


def test_render_refuses_a_directory_that_merely_looks_like_a_render(tmp_path: Path) -> None:
    """The issue's reproduction: config.yaml + plan.yaml made a directory count as a render."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_text("db: prod\n")
    (proj / "plan.yaml").write_text("steps: []\n")
    (proj / "important.txt").write_text("x\n")
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["render", "local", "--out", str(proj), *extra])
        assert result.exit_code == 2, result.output
        assert "is not a kilonode render" in result.output
    assert sorted(p.name for p in proj.iterdir()) == ["config.yaml", "important.txt", "plan.yaml"]
    assert (proj / "important.txt").read_text() == "x\n" and (proj / "config.yaml").read_text() == "db: prod\n"


def test_render_names_files_the_last_render_did_not_write_and_keeps_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(app, ["render", "local", "--out", str(out)]).exit_code == 0
    (out / "pool-cpu" / "NOTES.md").write_text("my notes")
    (out / "scratch").mkdir()
    result = runner.invoke(app, ["render", "local", "--out", str(out)])
    assert result.exit_code == 2
    assert "2 file(s) the last render did not write: pool-cpu/NOTES.md, scratch/" in result.output
    assert "--force" in result.output
    assert (out / "pool-cpu" / "NOTES.md").read_text() == "my notes"
    assert runner.invoke(app, ["render", "local", "--out", str(out), "--force"]).exit_code == 0
    assert not (out / "pool-cpu" / "NOTES.md").exists() and not (out / "scratch").exists()


def test_render_names_rendered_files_edited_since(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(app, ["render", "local", "--out", str(out)]).exit_code == 0
    edited = out / "pool-cpu" / "etc" / "sysctl.d" / "90-kilonode.conf"
    edited.write_text(edited.read_text() + "# hand edit\n")
    result = runner.invoke(app, ["render", "local", "--out", str(out)])
    assert result.exit_code == 2
    assert "1 rendered file(s) changed since the last render: pool-cpu/etc/sysctl.d/90-kilonode.conf" in result.output
    assert edited.read_text().endswith("# hand edit\n")


def test_render_refuses_another_stacks_render_without_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(app, ["render", "research-7500", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["render", "local", "--out", str(out)])
    assert result.exit_code == 2 and "render of stack 'research-7500', not 'local'" in result.output
    assert (out / "etcd-main-4").is_dir()
    assert runner.invoke(app, ["render", "local", "--out", str(out), "--force"]).exit_code == 0
    assert not (out / "etcd-main-4").exists()  # nothing left over from the bigger stack


def test_a_failed_write_leaves_the_previous_render_untouched(tmp_path: Path) -> None:
    stack = load_stack("local")
    tree = render_tree(stack.config, plan_stack(stack))
    out = tmp_path / "out"
    write_tree(tree, out, stack="local")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    broken = dict(tree)
    broken["pool-cpu/etc/docker/daemon.json/impossible"] = tree["config.yaml"]  # a file under a file
    with pytest.raises(OutputDirError, match="nothing was changed"):
        write_tree(broken, out, stack="local")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_write_tree_refuses_a_file_as_output(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(OutputDirError) as refused:
        write_tree({}, target, stack="local")
    assert str(refused.value) == f"{target} exists and is not a directory; choose a directory path for --out"
    assert target.read_text() == "x"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c["etcd"]["main"].update(members=4), "etcd.main.members"),
        (lambda c: c["nodePools"][0].update(runtim="docker"), "nodePools[0].runtim"),
        (lambda c: c.update(sysctl={"overrides": {"net.ipv4.neigh.default.gc_thresh1": 95000}}),
         "sysctl.overrides.net.ipv4.neigh.default.gc_thresh"),
        (lambda c: c["nodePools"][0].update(nodes=20000, podsPerNode=4), "nodePools[0].nodes"),
    ],
    ids=["even-members", "typo-key", "gc-thresh-order", "vnet-overflow"],
)
def test_bad_stacks_exit_2_name_file_and_field_and_write_nothing(
    write_stack: StackWriter, tmp_path: Path, mutate, field: str
) -> None:
    cluster = shipped_cluster_value("local")
    mutate(cluster)
    path = write_stack(cluster)
    out = tmp_path / "never"
    for command in (["validate", str(path)], ["render", str(path), "--out", str(out)], ["explain", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert str(path) in result.stderr and field in result.stderr
    assert not out.exists()


def test_validate_and_explain_report_counts_and_budgets() -> None:
    result = runner.invoke(app, ["validate", "research-7500"])
    # 5,000 + 2,500 GPU nodes, 3 system nodes and the monitoring node; 50 + 25 GPU scale sets, 3
    # system (one per zone) and 1 monitoring
    assert result.exit_code == 0 and "7,504 nodes" in result.stdout and "79 scale set" in result.stdout
    result = runner.invoke(app, ["explain", "research-7500"])
    assert result.exit_code == 0
    # 65,536 - (7,500 x (1 + 3) + 3 x (1 + 16) + 1 x (1 + 4) + 14 control plane) = 35,466 left
    assert "VNet private IPs" in result.stdout and f"{65_536 - (7_500 * 4 + 3 * 17 + 1 * 5 + 14):,}" in result.stdout
    assert "50 × 100" in result.stdout


def test_authentication_config_version_follows_kubernetes(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["kubernetesVersion"] = "1.33.4"
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    text = render_cluster(plan)["apiserver-0"]["etc/kubernetes/authentication-config.yaml"].content
    assert yaml.safe_load(text)["apiVersion"] == "apiserver.config.k8s.io/v1beta1"


# --- TLS cipher suites ------------------------------------------------------------------------

# By hand: the TLS 1.2 suites that are AEAD (AES-GCM, ChaCha20-Poly1305) with ECDHE, as the Go names
# k8s.io/component-base@v0.34.2 cli/flag/ciphersuites_flag.go and etcd v3.5.33
# client/pkg/tlsutil/cipher_suites.go both accept (the ChaCha20 pair by the names both map to
# tls.TLS_ECDHE_*_WITH_CHACHA20_POLY1305_SHA256).
AEAD_ECDHE = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
}


def tls_servers(rendered: Path) -> dict[str, list[str]]:
    """Every TLS server's offered suites, as the rendered host files give them."""
    suites: dict[str, list[str]] = {}
    for unit in rendered.glob("*/etc/systemd/system/*.service"):
        flags = flags_of(unit.read_text())
        for flag in ("tls-cipher-suites", "cipher-suites"):
            if flag in flags:
                suites[f"{unit.parent.parent.parent.parent.name}/{unit.name}"] = flags[flag].split(",")
    for config in rendered.glob("pool-*/etc/kubernetes/kubelet-config.yaml"):
        suites[f"{config.parent.parent.parent.name}/kubelet"] = yaml.safe_load(config.read_text())["tlsCipherSuites"]
    return suites


def test_every_tls_server_offers_only_aead_suites_and_one_its_ecdsa_key_can_use(rendered_7500: Path) -> None:
    servers = tls_servers(rendered_7500)
    programs = {name.split("/")[1] for name in servers}
    assert programs == {"etcd.service", "kube-apiserver.service", "kube-scheduler.service",
                        "kube-controller-manager.service", "kubelet"}
    for name, suites in servers.items():
        assert set(suites) <= AEAD_ECDHE and not any("CBC" in s for s in suites), name
        # every server's key is ECDSA P-256 (kilonode.plan.pki): an ECDHE_ECDSA suite must be there
        assert any(s.startswith("TLS_ECDHE_ECDSA_WITH_") for s in suites), name
    assert len({tuple(s) for s in servers.values()}) == 1  # one list, so any client of one fits all
