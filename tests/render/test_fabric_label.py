"""The InfiniBand fabric label: every IB node's kubelet registers kilonode.io/fabric=<its scale
set>, which a boot unit derives from the node's own host name (a scale set names its instances
<computer-name prefix><6 characters>); run here for real with a stand-in `hostname`."""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kilonode.plan import wellknown
from kilonode.render.pool import FABRIC_SCRIPT, FABRIC_UNIT, fabric_script, index_patterns
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def run_script(tmp_path: Path, script: str, hostname: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "hostname"
    fake.write_text(f"#!/bin/sh\necho {hostname}\n")
    fake.chmod(0o755)
    path = tmp_path / "fabric-label"
    path.write_text(script)
    path.chmod(0o755)
    output = tmp_path / "run" / "kilonode" / "fabric.env"
    result = subprocess.run(["/bin/sh", str(path), str(output)], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, check=False)
    return result, output


@pytest.mark.parametrize(("role", "hostname", "fabric"), [
    ("pool-h100-ib", "research-7500-h100-ib-017000004", "research-7500-h100-ib-017"),
    ("pool-a100-ib.team-vision", "research-7500-a100-ib-03000001a", "research-7500-a100-ib-030"),
])
def test_a_node_names_its_own_scale_set(tmp_path: Path, role: str, hostname: str, fabric: str) -> None:
    files = shared.rendered("research-7500")[role]
    result, output = run_script(tmp_path, files[FABRIC_SCRIPT].content, hostname)
    assert result.returncode == 0, result.stderr
    assert output.read_text() == f"{wellknown.FABRIC_ENV_VAR}={fabric}\n"
    assert not output.with_name("fabric.env.partial").exists()


def test_a_host_name_from_another_roles_scale_set_is_refused(tmp_path: Path) -> None:
    # a shared a100 node's script does not accept a vision scale set, nor a name too short to have one
    script = shared.rendered("research-7500")["pool-a100-ib"][FABRIC_SCRIPT].content
    for hostname in ("research-7500-a100-ib-03000001a", "research-7500-h100-ib-000000001", "short"):
        result, output = run_script(tmp_path, script, hostname)
        assert result.returncode == 1 and "no instance of this role's scale sets (pool-a100-ib)" in result.stderr
        assert not output.exists()


def test_the_kubelet_waits_for_the_label_and_fails_without_it() -> None:
    files = shared.rendered("research-7500")["pool-h100-ib"]
    kubelet = files["etc/systemd/system/kubelet.service"].content
    unit = FABRIC_UNIT.rpartition("/")[2]
    assert f"Requires={unit}" in kubelet and f"After={unit}" in kubelet
    assert f"EnvironmentFile={wellknown.FABRIC_ENV_FILE}" in kubelet  # no "-": a missing file fails it
    assert f"{wellknown.FABRIC_LABEL}=${{{wellknown.FABRIC_ENV_VAR}}}" in kubelet
    assert f"ExecStart=/{FABRIC_SCRIPT} {wellknown.FABRIC_ENV_FILE}" in files[FABRIC_UNIT].content
    # pools without InfiniBand have none of it
    system = shared.rendered("research-7500")["pool-system"]
    assert FABRIC_SCRIPT not in system
    assert wellknown.FABRIC_LABEL not in system["etc/systemd/system/kubelet.service"].content


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=1_100), max_size=60))
def test_index_patterns_match_exactly_the_indexes_given(indexes: set[int]) -> None:
    patterns = index_patterns(indexes)
    for i in range(0, 1_200):
        written = f"{i:03d}"
        assert any(fnmatch.fnmatchcase(written, p) for p in patterns) == (i in indexes), (i, patterns)
    # a run costs at most two patterns a digit, however long it is
    assert len(index_patterns(range(0, 1_000))) == 1
    assert len(index_patterns(range(7, 993))) <= 6


def test_the_script_does_not_grow_with_the_pool(tmp_path: Path) -> None:
    # 150 scale sets of a pool (15,000 InfiniBand nodes) take as many lines as its 25
    base = shared.plan("research-7500")
    [h100] = [p for p in base.node_pools if p.name == "h100-ib"]
    prefix = h100.shards[0].name.removesuffix("000")
    grown = h100.model_copy(update={"shards": tuple(
        h100.shards[0].model_copy(update={"name": f"{prefix}{i:03d}", "index": i}) for i in range(150))})
    small, large = fabric_script(h100), fabric_script(grown)
    assert len(large) - len(small) < 40
    # and the real shell takes the last scale set of the grown pool, and refuses one past it
    result, output = run_script(tmp_path, large, f"{prefix}149000004")
    assert result.returncode == 0 and output.read_text() == f"{wellknown.FABRIC_ENV_VAR}={prefix}149\n"
    result, _ = run_script(tmp_path, large, f"{prefix}150000004")
    assert result.returncode == 1
    result, _ = run_script(tmp_path, small, f"{prefix}025000004")
    assert result.returncode == 1
