"""Rendered artefacts are accepted by the programs that read them."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.plan import ClusterPlan
from kilonode.render import USER_DATA, HostFiles
from tests import shared
from tests.conftest import SHIPPED_STACKS
from tests.render.consumers import cloud_init_validator, systemd_verify

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# Binaries that are in no registry we reach (kubelet, cri-dockerd, Kubernetes control
# plane), and nft, which the node image installs (nftables, node-image/packages/base.txt) and
# this machine need not have; the units name them and systemd-analyze says they are missing.
# That is the only complaint tolerated, with the runtime units Debian's docker.io/containerd
# ship inside the node image (checked on a booted image by tests/image).
ABSENT_HERE = re.compile(
    r"Command (/usr/local/bin/(kubelet|cri-dockerd|kube-apiserver|kube-scheduler|kube-controller-manager|etcd)"
    r"|/usr/sbin/nft) is not executable: No such file or directory$"
)
RUNTIME_UNIT_ABSENT = re.compile(r"Unit (docker|containerd)\.service not found\.$")


def all_hosts() -> list[tuple[str, str, HostFiles]]:
    return [(stack, host, files) for stack in SHIPPED_STACKS for host, files in shared.rendered(stack).items()]


@pytest.fixture(scope="module")
def validate_user_data() -> Any:
    return cloud_init_validator()


def test_cloud_init_accepts_every_user_data(plans: dict[str, ClusterPlan], validate_user_data: Any) -> None:
    failures = {}
    for stack, host, files in all_hosts():
        config = yaml.safe_load(files[USER_DATA].content)
        if problems := validate_user_data(config):
            failures[f"{stack}/{host}"] = problems
    assert not failures


def test_cloud_init_validator_catches_mistakes(validate_user_data: Any) -> None:
    config = yaml.safe_load(shared.rendered("local")["pool-cpu"][USER_DATA].content)
    config["runcmnd"] = config.pop("runcmd")
    config["mounts"] = "/dev/vdb"
    assert validate_user_data(config) == [
        "unknown top-level key 'runcmnd'",
        "Cloud config schema errors: mounts: '/dev/vdb' is not of type 'array'",
    ]


def test_systemd_accepts_every_unit(plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    failures: dict[str, list[str]] = {}
    for stack, host, files in all_hosts():
        if stack != "local" and not host.startswith(("pool-", "etcd-main-0", "apiserver-0")):
            continue  # other members differ only in addresses
        unit_dir = tmp_path / stack / host
        units = []
        for path, file in files.items():
            if path.startswith("etc/systemd/system/"):
                target = unit_dir / path.removeprefix("etc/systemd/system/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(file.content)
                if target.parent == unit_dir:
                    units.append(target)
        executables = {f"/{p}" for p, f in files.items() if f.mode & 0o111}
        lines = systemd_verify(unit_dir, units)
        unexpected = [
            line for line in lines
            if not ABSENT_HERE.search(line)
            and not RUNTIME_UNIT_ABSENT.search(line)
            # a file this very host renders executable; the host writes it before starting units
            and not any(f"Command {exe} is not executable" in line for exe in executables)
        ]
        if unexpected:
            failures[f"{stack}/{host}"] = unexpected
    assert not failures


def test_systemd_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    unit = tmp_path / "broken.service"
    unit.write_text("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\nRestartt=always\n")
    # one complaint, at the misspelt key's line (systemd's wording varies by version:
    # "Unknown key 'Restartt' in section [Service]", older "Unknown key name 'Restartt' ...")
    [line] = systemd_verify(tmp_path, [unit])
    assert line.startswith(f"{unit}:5: Unknown key") and "'Restartt'" in line


def test_runtime_configs_parse(plans: dict[str, ClusterPlan]) -> None:
    seen = set()
    for _stack, _host, files in all_hosts():
        for path, file in files.items():
            if path.endswith(".json"):
                json.loads(file.content)
                seen.add("json")
            elif path.endswith(".toml"):
                tomllib.loads(file.content)
                seen.add("toml")
            elif path.endswith(".yaml"):
                assert isinstance(yaml.safe_load(file.content), dict)
                seen.add("yaml")
    assert seen == {"json", "toml", "yaml"}
