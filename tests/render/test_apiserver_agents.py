"""The apiserver-VM agents that parse node-controlled input (the node client approver: bootstrap
CSRs; the GPU health controller: Node objects) run as no one who can read the control plane's
keys. Checked with systemd's own verifier, and against the PKI layout's files by hand-written
rules: which files are keys is read from the layout, what must stay out of reach is not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kilonode.plan import pki, wellknown
from tests import shared
from tests.render.consumers import systemd_verify

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"  # GPU pools: both agents on every apiserver
UNITS = {
    "etc/systemd/system/kilonode-node-client-approver.service": wellknown.NODE_CLIENT_APPROVER_KUBECONFIG,
    "etc/systemd/system/kilonode-gpu-health-controller.service": wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG,
}
# Written by hand from what an attacker holding the process would want most: the cluster CA's
# key (any identity), the service-account signing key (any ServiceAccount token), the apiserver's
# etcd client key (all of etcd), and the key that encrypts Secrets at rest.
CROWN_JEWELS = (wellknown.K8S_CA_KEY, wellknown.SERVICE_ACCOUNT_KEY, wellknown.APISERVER_ETCD_CLIENT_KEY,
                wellknown.ENCRYPTION_CONFIG)


def service_settings(text: str) -> dict[str, list[str]]:
    """Each [Service] directive's values, in order (a directive may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def hidden(path: str, inaccessible: list[str]) -> bool:
    entries = [e.removeprefix("-") for value in inaccessible for e in value.split()]
    return any(path == e or path.startswith(e.rstrip("/") + "/") for e in entries)


@pytest.mark.parametrize("unit_path", UNITS)
def test_each_agent_runs_as_a_dynamic_user_with_its_kubeconfig_as_a_credential(unit_path: str,
                                                                                tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    for host, files in shared.rendered(STACK).items():
        if not host.startswith("apiserver-"):
            continue
        text = files[unit_path].content
        unit = tmp_path / Path(unit_path).name
        unit.write_text(text)
        assert systemd_verify(tmp_path, [unit]) == [], host
        settings = service_settings(text)
        assert settings["DynamicUser"] == ["yes"] and "User" not in settings, host
        # the one credential: its kubeconfig, the file the layout delivers to this host (root's, 0600)
        assert settings["LoadCredential"] == [f"kubeconfig:{UNITS[unit_path]}"], host
        assert "--kubeconfig=%d/kubeconfig" in settings["ExecStart"][0].split(), host
        delivered = {f.path: f for f in pki.pki_layout(shared.plan(STACK)).hosts[host]}
        assert delivered[UNITS[unit_path]].mode == 0o600
        assert not hidden(UNITS[unit_path], settings["InaccessiblePaths"])


@pytest.mark.parametrize("unit_path", UNITS)
def test_no_key_on_an_apiserver_is_in_the_agents_view(unit_path: str) -> None:
    plan = shared.plan(STACK)
    layout = pki.pki_layout(plan)
    for instance in plan.control_plane.instances:
        settings = service_settings(shared.rendered(STACK)[instance.name][unit_path].content)
        keys = [f.path for f in layout.hosts[instance.name] if isinstance(f.content, pki.PrivateKey)]
        assert set(CROWN_JEWELS) - {wellknown.ENCRYPTION_CONFIG} <= set(keys)  # the layout still names them
        for path in (*keys, *CROWN_JEWELS):
            assert hidden(path, settings["InaccessiblePaths"]), (instance.name, path)
