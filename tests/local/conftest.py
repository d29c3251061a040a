"""The local rehearsal's tests: a state directory whose etcd members and VMs are stopped after
the test, whatever happened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kilonode.local import rehearsal


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    if not Path("/usr/bin/etcd").exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server and etcd-client)")
    directory = tmp_path / "state"
    try:
        yield directory
    finally:
        # whatever happened, stop what the test started: by the PID files, as `down` does
        rehearsal.down(directory, keep=False, progress=lambda _: None)
