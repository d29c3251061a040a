"""The `promtool` fixture: Prometheus' own checker, unpacked by `make test-artefacts`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.monitoring.promtool import promtool_path


@pytest.fixture(scope="session")
def promtool() -> Path:
    try:
        return promtool_path()
    except RuntimeError as error:  # `make test` and `make test-fast` unpack it first: never a skip
        pytest.fail(str(error))
