"""pod-security: each workload's pod template against its namespace's Pod Security enforce level,
with breaks planted in a copy of research-7500's graph, and the Pod Security Standards' rules on
hand-written pod specs (kubernetes.io/docs/concepts/security/pod-security-standards/)."""

from __future__ import annotations

from typing import Any

import yaml

from kilonode.preflight import breaks, run
from kilonode.preflight.checks import pod_security
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

STACK = "research-7500"
ENFORCE = "pod-security.kubernetes.io/enforce"


def found(graph: dict[str, Any] | None = None, files: dict[str, str] | None = None,
          stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, files=files, graph=graph), ["pod-security"]))


def test_the_shipped_stacks_pass(shipped: str) -> None:
    assert found(stack=shipped) == []


def test_kube_system_at_baseline_refuses_the_node_agents() -> None:
    _, graph = artefacts(STACK)
    resource(graph, "NamespacePatch", "kube-system")["inputs"]["metadata"]["labels"][ENFORCE] = "baseline"
    where = {f.where for f in found(graph)}
    for agent in ("DaemonSet kube-system/kube-proxy", "DaemonSet kube-system/calico-node",
                  "DaemonSet kube-system/cloud-node-manager"):
        assert agent in where
    assert any("nvidia-device-plugin" in w for w in where) and any("rdma" in w for w in where)
    [proxy] = [f for f in found(graph) if f.where == "DaemonSet kube-system/kube-proxy"]
    assert "enforces Pod Security `baseline`" in proxy.what and "privileged" in proxy.what
    assert "hostNetwork" in proxy.what and "a new node never gets one" in proxy.what
    assert "POD_SECURITY_NAMESPACES" in proxy.fix


def test_a_restricted_namespaces_balloon_must_meet_restricted() -> None:
    _, graph = artefacts(STACK)
    [balloon] = [r for r in graph["resources"] if r["type"].endswith(":Deployment")
                 and r["inputs"]["metadata"]["namespace"] == "kilonode-capacity"][:1]
    spec = balloon["inputs"]["spec"]["template"]["spec"]
    spec.get("securityContext", {}).pop("runAsNonRoot", None)
    for container in spec["containers"]:
        context = container.setdefault("securityContext", {})
        context.pop("runAsNonRoot", None)
        context["allowPrivilegeEscalation"] = True
        context["capabilities"] = {"drop": ["NET_RAW"]}
    [f] = found(graph)
    assert "`restricted`" in f.what and "runAsNonRoot" in f.what and "allowPrivilegeEscalation" in f.what
    assert "does not drop ALL" in f.what


def test_an_exempt_namespace_passes_and_the_default_applies_without_a_label() -> None:
    files, graph = artefacts(STACK)
    patch = resource(graph, "NamespacePatch", "kube-system")["inputs"]["metadata"]["labels"]
    del patch[ENFORCE]  # no label: the admission configuration's default, baseline
    assert any("default enforce level baseline" in f.what for f in found(graph))
    for key in [k for k in files if k.endswith(pod_security.ADMISSION_CONFIG)]:
        config = yaml.safe_load(files[key])
        config["plugins"][0]["configuration"]["exemptions"]["namespaces"] = ["kube-system"]
        files[key] = yaml.safe_dump(config)
    assert found(graph, files) == []


def test_the_standards_rules_on_hand_written_specs() -> None:
    privileged = {"hostNetwork": True, "hostPID": True, "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
                  "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}],
                                  "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN",
                                                                                                    "CHOWN"]}}}]}
    said = pod_security.violations(privileged, "baseline")
    assert said == ["container c privileged", "container c adds SYS_ADMIN", "container c hostPort 80", "hostNetwork",
                    "hostPID", "hostPath volume dev"]
    assert pod_security.violations(privileged, "privileged") == []
    good = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "x", "emptyDir": {}}],
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}
    assert pod_security.violations(good, "restricted") == []
    root = {**good, "securityContext": {"runAsNonRoot": True, "runAsUser": 0}}
    assert pod_security.violations(root, "restricted") == [
        "pod runAsUser 0", "container c without seccomp RuntimeDefault or Localhost"]
    assert pod_security.violations({**good, "volumes": [{"name": "n", "nfs": {}}]}, "restricted") == ["volume n (nfs)"]
