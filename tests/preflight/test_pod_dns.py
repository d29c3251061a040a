"""pod-dns: each pool's resolvers per dnsPolicy and the cluster DNS address served; seeded breaks."""

from __future__ import annotations

import yaml

from kilonode.preflight import Finding, run
from tests.preflight.conftest import artefacts, inputs_of, resource

KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"


def findings(stack: str, **planted: object) -> list[Finding]:
    return run(inputs_of(stack, **planted), ["pod-dns"])  # type: ignore[arg-type]


def breaks(found: list[Finding]) -> dict[str, str]:
    return {f.where: f.what for f in found if f.level == "break"}


def test_the_shipped_stacks_resolve(shipped: str) -> None:
    assert breaks(findings(shipped)) == {}


def test_the_kubelets_resolv_conf_is_resolveds_upstream_list() -> None:
    files, _ = artefacts("research-7500")
    config = yaml.safe_load(files[f"pool-system/{KUBELET_CONFIG}"])
    assert config["resolvConf"] == "/run/systemd/resolve/resolv.conf"


def test_no_resolv_conf_on_a_systemd_resolved_image_gives_pods_the_stub_and_halts_coredns() -> None:
    files, graph = artefacts("local")
    config = yaml.safe_load(files[f"pool-cpu/{KUBELET_CONFIG}"])
    del config["resolvConf"]  # the kubelet's default: /etc/resolv.conf, resolved's stub
    files[f"pool-cpu/{KUBELET_CONFIG}"] = yaml.safe_dump(config)
    found = breaks(findings("local", files=files, graph=graph))
    assert "nameserver 127.0.0.53" in found["pool-cpu"]
    assert "Deployment kube-system/coredns" in found["pool-cpu"]
    assert "`loop` plugin halts it" in found["Deployment kube-system/coredns on pool-cpu"]


def test_a_resolv_conf_the_image_does_not_have_is_a_break() -> None:
    files, graph = artefacts("local")
    config = yaml.safe_load(files[f"pool-cpu/{KUBELET_CONFIG}"])
    config["resolvConf"] = "/etc/kilonode/resolv.conf"
    files[f"pool-cpu/{KUBELET_CONFIG}"] = yaml.safe_dump(config)
    files["pool-cpu/etc/kilonode/resolv.conf"] = "nameserver 127.0.0.1\n"  # rendered, and loopback
    assert "nameserver 127.0.0.1" in breaks(findings("local", files=files, graph=graph))["pool-cpu"]


def test_a_cluster_dns_address_no_service_serves_is_a_break() -> None:
    files, graph = artefacts("local")
    resource(graph, "Service", "kube-dns")["inputs"]["spec"]["clusterIP"] = "10.96.0.99"
    found = breaks(findings("local", files=files, graph=graph))
    assert any(w.startswith("clusterDNS ") and "no Service in the graph" in what for w, what in found.items())


def test_a_cluster_dns_whose_backend_cannot_be_placed_is_a_break() -> None:
    files, graph = artefacts("local")
    spec = resource(graph, "Deployment", "coredns")["inputs"]["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"example.com/none": "x"}
    found = breaks(findings("local", files=files, graph=graph))
    assert any("has no backend at bootstrap (Deployment kube-system/coredns" in what for what in found.values())
