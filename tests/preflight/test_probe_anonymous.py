"""probe-anonymous: the apiserver load balancers' HTTPS /readyz probe answered without credentials (the
fourteenth independent trace of `kilonode diff`, PR 06: CIS hardening `anonymous: {enabled: false}` in the
AuthenticationConfiguration took every rolled apiserver out of both load balancers, and nothing said so)."""

from __future__ import annotations

import pytest

from kilonode.preflight.checks import probe_anonymous
from tests.preflight.conftest import artefacts, inputs_of
from tests.shared import SHIPPED_STACKS

STACK = "research-7500"
CONFIG = "etc/kubernetes/authentication-config.yaml"
UNIT = "etc/systemd/system/kube-apiserver.service"


def _edit(files: dict[str, str], suffix: str, old: str, new: str, hosts: int = 99) -> None:
    done = 0
    for key in sorted(files):
        if key.startswith("apiserver-") and key.endswith(suffix) and done < hosts:
            assert old in files[key], key
            files[key] = files[key].replace(old, new)
            done += 1
    assert done


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_shipped_stacks_pass(stack: str) -> None:
    assert probe_anonymous.check(inputs_of(stack)) == []


def test_anonymous_off_in_the_authentication_config_breaks() -> None:
    files, graph = artefacts(STACK)
    _edit(files, CONFIG, "  enabled: true\n", "  enabled: false\n")
    [found] = probe_anonymous.check(inputs_of(STACK, files, graph))
    assert found.level == "break" and "401: anonymous authentication is off" in found.what
    assert "apiserver-lb" in found.what and found.where.count("apiserver-") == 5


def test_readyz_dropped_from_the_conditions_breaks_on_the_hosts_that_roll() -> None:
    files, graph = artefacts(STACK)
    _edit(files, CONFIG, "  - path: /readyz\n", "", hosts=1)
    [found] = probe_anonymous.check(inputs_of(STACK, files, graph))
    assert "only on other paths" in found.what and found.where == "apiserver-0"


def test_a_probe_on_a_path_rbac_refuses_anonymous_breaks() -> None:
    files, graph = artefacts(STACK)
    _edit(files, CONFIG, "  - path: /readyz\n", "  - path: /readyz\n  - path: /metrics\n")
    for r in graph["resources"]:
        if r["type"] == probe_anonymous.LOAD_BALANCER:
            for probe in r["inputs"]["probes"]:
                probe["requestPath"] = "/metrics"
    [found] = probe_anonymous.check(inputs_of(STACK, files, graph))
    assert "403" in found.what and "system:public-info-viewer" in found.what


def test_no_authentication_config_and_the_flag_off_breaks() -> None:
    files, graph = artefacts(STACK)
    _edit(files, UNIT, "--authentication-config=", "--anonymous-auth=false --x-was-authentication-config=")
    [found] = probe_anonymous.check(inputs_of(STACK, files, graph))
    assert "--anonymous-auth=false" in found.what
