"""PodSecurity admission: the apiserver's admission configuration (its flag, the file it reads
and the file's way onto the host agree), the labels of every namespace kilonode creates or
relies on, and every pod kilonode creates admitted under its namespace's enforce level,
checked offline by tests/k8s/pod_security_standards.py (a port of upstream's checks) over the
recorded graphs of the shipped stacks. Seeded breaks show each check refuses."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from pulumi_kubernetes import core

from kilonode.azure.graph import Graph, Recorded
from kilonode.catalog.components import components
from kilonode.k8s.pod_security import LABEL_PREFIX, MODES, POD_CREATORS
from kilonode.k8s.pods import system_pod_spec
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan, defaults
from kilonode.render.control_plane import ADMISSION_CONFIG
from tests import shared
from tests.k8s import pod_security_standards as pss

STACKS = list(shared.SHIPPED_STACKS)


def admission_defaults(stack: str) -> dict[str, str]:
    """The PodSecurity defaults from the file the apiserver reads, as rendered."""
    config = shared.load_yaml(shared.rendered(stack)["apiserver-0"][ADMISSION_CONFIG].content)
    [plugin] = config["plugins"]
    assert plugin["name"] == "PodSecurity"
    return dict(plugin["configuration"]["defaults"])


def namespace_levels(graph: Graph, stack: str) -> dict[str, dict[str, str]]:
    """namespace -> its PodSecurity labels, from the Namespaces and patches in the graph."""
    levels = {}
    for record in graph.resources:
        if record.type in ("kubernetes:core/v1:Namespace", "kubernetes:core/v1:NamespacePatch"):
            metadata = record.plain()["metadata"]
            levels[metadata["name"]] = {k.removeprefix(LABEL_PREFIX): v for k, v in metadata.get("labels", {}).items()
                                        if k.startswith(LABEL_PREFIX)}
    return levels


def enforced(levels: dict[str, dict[str, str]], namespace: str, stack: str) -> str:
    """The level PodSecurity enforces in `namespace`: its label, else the configuration's default."""
    return levels.get(namespace, {}).get("enforce") or admission_defaults(stack)["enforce"]


def pod_creators(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.type in POD_CREATORS]


def pod_spec(record: Recorded) -> dict[str, Any]:
    value = record.plain()
    return value["spec"] if record.type == "kubernetes:core/v1:Pod" else value["spec"]["template"]["spec"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_apiserver_reads_the_admission_configuration_it_is_given(stack: str, plans: dict[str, ClusterPlan]) -> None:
    version = f"v1.{plans[stack].kubernetes_minor}"
    for host, files in shared.rendered(stack).items():
        if not host.startswith("apiserver-"):
            continue
        unit = files["etc/systemd/system/kube-apiserver.service"].content
        assert f"--admission-control-config-file=/{ADMISSION_CONFIG} " in unit
        # the file reaches the host through the apiserver's cloud-init (write_files)
        written = {f["path"]: f["content"] for f in shared.load_yaml(files["user-data"].content)["write_files"]}
        assert written[f"/{ADMISSION_CONFIG}"] == files[ADMISSION_CONFIG].content
    assert admission_defaults(stack) == {
        "enforce": defaults.POD_SECURITY_DEFAULT_ENFORCE, "enforce-version": version,
        "audit": defaults.POD_SECURITY_DEFAULT_AUDIT, "audit-version": version,
        "warn": defaults.POD_SECURITY_DEFAULT_WARN, "warn-version": version,
    }
    assert defaults.POD_SECURITY_DEFAULT_ENFORCE == "baseline"


@pytest.mark.parametrize("stack", STACKS)
def test_every_namespace_kilonode_creates_or_runs_pods_in_is_labelled(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str,
) -> None:
    graph = graphs[stack]
    levels = namespace_levels(graph, stack)
    version = f"v1.{plans[stack].kubernetes_minor}"
    assert "kube-system" in levels and levels["kube-system"]["enforce"] == "privileged"
    for namespace, labels in levels.items():
        expected = defaults.POD_SECURITY_NAMESPACES[namespace]
        assert labels == {**{m: expected[m] for m in MODES}, **{f"{m}-version": version for m in MODES}}, namespace
    # every namespace a pod creator uses is one of them, or takes the configuration's default
    used = {r.plain()["metadata"].get("namespace", "default") for r in pod_creators(graph)}
    assert used <= set(levels), used - set(levels)


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_kilonode_creates_is_admitted_under_its_namespaces_level(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str,
) -> None:
    graph, minor = graphs[stack], plans[stack].kubernetes_minor
    levels = namespace_levels(graph, stack)
    creators = pod_creators(graph)
    assert len(creators) >= 6
    for record in creators:
        namespace = record.plain()["metadata"].get("namespace", "default")
        assert pss.violations(pod_spec(record), enforced(levels, namespace, stack), minor) == [], record.name


@pytest.mark.parametrize("stack", STACKS)
def test_kube_system_pods_wait_for_its_labels(graphs: dict[str, Graph], stack: str) -> None:
    patch = next(r.name for r in graphs[stack].resources if r.type == "kubernetes:core/v1:NamespacePatch")
    for record in pod_creators(graphs[stack]):
        assert patch in record.depends_on, record.name


def exceptions() -> dict[str, Any]:
    document: dict[str, Any] = shared.load_yaml((REPO_ROOT / "policy/security-exceptions.yaml").read_text())
    return document


def needs(problems: list[str]) -> set[str]:
    """A baseline violation's kind, as policy/security-exceptions.yaml names it."""
    return {"hostPath" if p.startswith("hostPath volume") else p.split(" ")[0] for p in problems}


@pytest.mark.parametrize("stack", STACKS)
def test_the_pods_that_need_more_than_baseline_are_the_accepted_exceptions(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str,
) -> None:
    """Every kube-system pod that needs its `privileged` label is listed with its reason, with
    exactly what it needs: a new one, or a listed one needing more, is added on purpose."""
    accepted = exceptions()["podSecurity"]
    for record in pod_creators(graphs[stack]):
        metadata = record.plain()["metadata"]
        found = needs(pss.violations(pod_spec(record), "baseline", plans[stack].kubernetes_minor))
        if found:
            assert metadata["namespace"] == "kube-system", metadata
            assert metadata["name"] in accepted, f"{metadata['name']} needs {found}: not an accepted exception"
            assert found == set(accepted[metadata["name"]]["needs"]), metadata["name"]
    assert all(entry["reason"].strip() for entry in accepted.values())


def test_every_accepted_pod_exception_is_still_needed(graphs: dict[str, Graph]) -> None:
    """research-7500 runs every one of them (GPU, InfiniBand, autoscaled pools): an exception
    whose pod is gone or meets baseline now is removed from the file."""
    found = {r.plain()["metadata"]["name"] for r in pod_creators(graphs["research-7500"])
             if pss.violations(pod_spec(r), "baseline", 34)}
    assert found == set(exceptions()["podSecurity"])


def _kube_proxy(graphs: dict[str, Graph]) -> dict[str, Any]:
    record = next(r for r in pod_creators(graphs["local"]) if r.plain()["metadata"]["name"] == "kube-proxy")
    return pod_spec(record)


def test_kube_proxy_would_be_refused_outside_kube_system(graphs: dict[str, Graph]) -> None:
    """Seeded break: the same pod in a namespace at the cluster's default (or with kube-system's
    label gone) is refused: privileged, host network, hostPath."""
    levels = namespace_levels(graphs["local"], "local")
    problems = pss.violations(_kube_proxy(graphs), enforced(levels, "kilonode-scratch", "local"), 34)
    assert any(p.startswith("privileged") for p in problems)
    assert "hostNetwork" in problems and any(p.startswith("hostPath volume") for p in problems)
    del levels["kube-system"]
    assert pss.violations(_kube_proxy(graphs), enforced(levels, "kube-system", "local"), 34)


def _minimal() -> dict[str, Any]:
    """A pod that meets `restricted`: each seeded break below changes one field."""
    return {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "i", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
    }


BREAKS: list[tuple[str, str, Any, str]] = [
    # (where, key, value, level at which it is refused)
    ("container", "privileged", True, "baseline"),
    ("container", "capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "baseline"),
    ("container", "procMount", "Unmasked", "baseline"),
    ("container", "seLinuxOptions", {"type": "spc_t"}, "baseline"),
    ("container", "windowsOptions", {"hostProcess": True}, "baseline"),
    ("container", "appArmorProfile", {"type": "Unconfined"}, "baseline"),
    ("pod", "seccompProfile", {"type": "Unconfined"}, "baseline"),
    ("pod", "sysctls", [{"name": "kernel.msgmax", "value": "1"}], "baseline"),
    ("spec", "hostNetwork", True, "baseline"),
    ("spec", "hostPID", True, "baseline"),
    ("spec", "hostIPC", True, "baseline"),
    ("spec", "volumes", [{"name": "root", "hostPath": {"path": "/"}}], "baseline"),
    ("ports", "ports", [{"containerPort": 80, "hostPort": 80}], "baseline"),
    ("probe", "livenessProbe", {"httpGet": {"host": "169.254.169.254", "port": 80}}, "baseline"),
    ("container", "allowPrivilegeEscalation", True, "restricted"),
    ("container", "capabilities", {"drop": ["NET_RAW"]}, "restricted"),
    ("pod", "runAsNonRoot", False, "restricted"),
    ("pod", "runAsUser", 0, "restricted"),
    ("pod", "seccompProfile", None, "restricted"),
    ("spec", "volumes", [{"name": "nfs", "nfs": {"server": "x", "path": "/"}}], "restricted"),
]


@pytest.mark.parametrize(("where", "key", "value", "level"), BREAKS, ids=[f"{b[1]}-{b[3]}" for b in BREAKS])
def test_each_seeded_break_is_refused_at_its_level_and_not_below(where: str, key: str, value: Any, level: str) -> None:
    spec = _minimal()
    assert pss.violations(spec, "restricted", 34) == []
    broken = copy.deepcopy(spec)
    container = broken["containers"][0]
    target = {"container": container["securityContext"], "pod": broken["securityContext"], "spec": broken,
              "ports": container, "probe": container}[where]
    if value is None:
        del target[key]
    else:
        target[key] = value
    assert pss.violations(broken, level, 34), (key, value)
    below = pss.LEVELS[pss.LEVELS.index(level) - 1]
    assert pss.violations(broken, below, 34) == [], (key, value, below)


def test_an_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown PodSecurity level"):
        pss.violations(_minimal(), "strict", 34)


def test_probe_hosts_are_checked_from_1_34() -> None:
    spec = _minimal()
    spec["containers"][0]["readinessProbe"] = {"tcpSocket": {"host": "10.0.0.1", "port": 1}}
    assert pss.violations(spec, "baseline", 33) == [] and pss.violations(spec, "baseline", 34)


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_runs_under_the_runtime_default_seccomp_profile_and_system_pods_request(
    graphs: dict[str, Graph], stack: str,
) -> None:
    for record in pod_creators(graphs[stack]):
        spec = pod_spec(record)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, record.name
        if record.plain()["metadata"]["namespace"] == "kube-system":
            for container in pss.containers(spec):
                assert {"cpu", "memory"} <= set(container.get("resources", {}).get("requests", {})), record.name


def test_a_system_pod_without_seccomp_is_refused_where_it_is_built() -> None:
    """Seeded break: a caller's own pod security context without the profile."""
    with pytest.raises(ValueError, match="pod_security_context"):
        system_pod_spec("cluster", containers=[], security_context=core.v1.PodSecurityContextArgs(run_as_user=1))
    assert system_pod_spec("cluster", containers=[]).security_context.seccomp_profile.type == "RuntimeDefault"


def test_every_catalogue_image_pinned_by_tag_only_is_an_accepted_exception() -> None:
    """Images by digest everywhere a digest is known; the rest listed with why (never invented).
    A row is by tag where any of its releases is (a per-release `digests` that misses one)."""
    rows = yaml.safe_load((REPO_ROOT / "infra/kilonode/catalog/components.yaml").read_text())["components"]

    def whole(row: dict[str, Any]) -> bool:
        if row.get("followsKubernetes"):
            return False  # any patch release may be chosen: no table covers them all
        releases = set(row.get("versions", {}).values()) or {row.get("version")}
        return all("@{digest}" in image or all(role in row.get("digests", {}).get(r, {}) for r in releases)
                   for role, image in row["images"].items())

    by_tag = {name for name, row in rows.items() if row.get("images") and not whole(row)}
    assert by_tag == set(exceptions()["imagesByTag"])
    assert all(reason.strip() for reason in exceptions()["imagesByTag"].values())
    # the catalogue's own account agrees
    assert by_tag == {name for name, row in rows.items() if row.get("images")
                      and getattr(components(), re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), name)).by_tag()}
