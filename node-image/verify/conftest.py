"""The node image's testinfra suite: one file per concern, driven by the build manifest.

`kilonode image verify` runs it three times (phases), pointing KILONODE_VERIFY_CONTEXT at a
JSON file: the phase, the manifest (the pool's plan, rendered artefacts' sha256, preloaded
images' IDs), the image file (offline phase) and the SSH target (guest phases).

- offline: test_offline_image.py and test_offline_gpu.py only, read from the image with debugfs;
- first-boot: every other test, over paramiko with sudo;
- after-reboot: the tests marked `persistent` only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import testinfra

from kilonode.image.disk import ImageFs
from kilonode.image.manifest import Manifest
from kilonode.plan.model import NodePoolPlan

CONTEXT: dict[str, Any] = json.loads(Path(os.environ["KILONODE_VERIFY_CONTEXT"]).read_text())
MANIFEST = Manifest.load(Path(CONTEXT["manifest"]))
POOL = MANIFEST.pool
OFFLINE_MODULES = ("test_offline_image", "test_offline_gpu")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "persistent: must still hold after a reboot (re-run after reboot)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = CONTEXT["phase"]
    keep, drop = [], []
    for item in items:
        offline = item.module is not None and item.module.__name__.endswith(OFFLINE_MODULES)
        if phase == "offline":
            wanted = offline
        elif phase == "after-reboot":
            wanted = not offline and item.get_closest_marker("persistent") is not None
        else:
            wanted = not offline
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize from the plan and manifest, so every check is named by what it checks."""
    names = metafunc.fixturenames
    if "sysctl" in names:
        metafunc.parametrize("sysctl", POOL.sysctls, ids=[s.name for s in POOL.sysctls])
    if "preloaded" in names:
        images = MANIFEST.preloaded_images
        metafunc.parametrize("preloaded", images, ids=[i["image"] for i in images])
    if "artefact" in names:
        files = MANIFEST.artefacts
        metafunc.parametrize("artefact", files, ids=[f["path"] for f in files])
    if "binary" in names:
        binaries = MANIFEST.binaries
        metafunc.parametrize("binary", binaries, ids=[b["name"] for b in binaries])


@pytest.fixture(scope="session")
def manifest() -> Manifest:
    return MANIFEST


@pytest.fixture(scope="session")
def pool() -> NodePoolPlan:
    return POOL


@pytest.fixture(scope="session")
def ssh() -> dict[str, Any]:
    if not CONTEXT.get("ssh"):
        pytest.skip("no SSH target in this phase")
    return dict(CONTEXT["ssh"])


@pytest.fixture(scope="session")
def host(ssh: dict[str, Any]) -> testinfra.host.Host:
    # Our own `host` fixture (not --hosts): test IDs stay free of ports and addresses.
    return testinfra.get_host(ssh["hostspec"], ssh_config=ssh["ssh_config"], timeout=60)


@pytest.fixture(scope="session")
def image_fs() -> ImageFs:
    if not CONTEXT.get("image"):
        pytest.skip("no image file in this phase")
    return ImageFs(Path(CONTEXT["image"]))
