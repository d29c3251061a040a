"""The etcd member's boot path as rendered: the unit hands etcd-join's verdict to etcd through
its environment, and etcd-join decides each case as its header says (run here against a fake
etcdctl that plays the cluster; on real etcd in tests/etcd/test_faults.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.plan import ClusterPlan, plan_stack, wellknown
from kilonode.problems import StackError
from kilonode.render import USER_DATA, render_cluster
from kilonode.render.etcd import ETCD_JOIN, ETCD_UNIT
from tests import shared
from tests.conftest import SHIPPED_STACKS, StackWriter, shipped_cluster_value
from tests.etcd.harness import Unit
from tests.render.consumers import systemd_verify

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

REFERENCE = tomllib.loads((Path(__file__).parents[1] / "render" / "upstream_flags.toml").read_text())
ETCD_35_FLAGS = {f for source in REFERENCE["flags"]["etcd"]["3.5"]["sources"] for f in source["flags"]}


def members(plans: dict[str, ClusterPlan]) -> list[tuple[str, Any, Any, dict[str, Any]]]:
    """(stack, cluster, member, its rendered files) for every etcd member of every shipped stack."""
    found = []
    for stack in SHIPPED_STACKS:
        hosts = shared.rendered(stack)
        found += [(stack, c, m, hosts[m.name]) for c in plans[stack].etcd_clusters for m in c.members]
    return found


def script_values(script: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)='([^']*)'$", script, flags=re.M))


# --- the unit and the script, as rendered ---------------------------------------------------------

def test_the_state_reaches_etcd_as_a_variable_never_as_a_flag(plans: dict[str, ClusterPlan]) -> None:
    for stack, _cluster, member, files in members(plans):
        unit = Unit(files[ETCD_UNIT].content)
        [exec_start] = unit.commands("ExecStart")
        flags = {arg.removeprefix("--").split("=", 1)[0] for arg in exec_start.argv[1:]}
        environment = unit.environment()
        assert environment == {"ETCD_INITIAL_CLUSTER_STATE": "new"}, (stack, member.name)
        for name in environment:
            # ETCD_<FLAG> names a live etcd 3.5 flag (pkg/flags FlagToEnv), and the flag is not
            # also on the command line: etcd stops on that ("conflicting environment variable")
            flag = name.removeprefix("ETCD_").lower().replace("_", "-")
            assert flag in ETCD_35_FLAGS and flag not in flags, (stack, member.name, flag)
        # etcd-join's file overrides it; optional ("-"): no file, no override
        script = script_values(files[ETCD_JOIN].content)
        assert unit.environment_files() == [(script["ENV_FILE"], True)]
        assert script["ENV_FILE"].startswith(f"/run/{unit.value('RuntimeDirectory')}/")
        assert script["READY_MARKER"].startswith(f"/var/lib/{unit.value('StateDirectory')}/")


def test_etcd_join_runs_before_etcd_as_the_etcd_user_and_the_marker_after_it(plans: dict[str, ClusterPlan]) -> None:
    for stack, cluster, member, files in members(plans):
        unit = Unit(files[ETCD_UNIT].content)
        assert unit.value("User") == "etcd" and unit.value("Type") == "notify"
        install, join = unit.commands("ExecStartPre")
        assert install.privileged and install.argv[-1] == cluster.data_dir  # the data dir first, as root
        assert join.argv == [f"/{ETCD_JOIN}"] and not join.privileged and not join.ignore_failure
        [marker] = unit.commands("ExecStartPost")
        script = script_values(files[ETCD_JOIN].content)
        assert marker.argv == ["/usr/bin/touch", script["READY_MARKER"]] and marker.ignore_failure
        assert files[ETCD_JOIN].mode == 0o755, (stack, member.name)
        written = {f["path"]: f for f in yaml.safe_load(files[USER_DATA].content)["write_files"]}
        assert written[f"/{ETCD_JOIN}"]["permissions"] == "0755"


def test_etcd_join_asks_its_own_cluster_with_its_own_certificate(plans: dict[str, ClusterPlan]) -> None:
    for stack, cluster, member, files in members(plans):
        script = files[ETCD_JOIN].content
        values = script_values(script)
        [exec_start] = Unit(files[ETCD_UNIT].content).commands("ExecStart")
        flags = dict(arg.removeprefix("--").split("=", 1) for arg in exec_start.argv[1:])
        assert values["NAME"] == flags["name"] == member.name
        assert values["PEER_URL"] == flags["initial-advertise-peer-urls"] == member.peer_url
        assert values["DATA_DIR"] == flags["data-dir"]
        assert values["OTHERS"].split() == [m.client_url for m in cluster.members if m != member], stack
        # the etcdctl of the pinned release (node-image/binaries.toml puts it beside etcd)
        assert values["ETCDCTL"] == str(Path(exec_start.argv[0]).with_name("etcdctl"))
        # the server certificate is a client certificate too; the other members' server
        # certificates are signed by the cluster's CA, the file the peers trust
        assert f"--cert='{flags['cert-file']}' --key='{flags['key-file']}'" in script
        assert f"--cacert='{flags['peer-trusted-ca-file']}'" in script
        assert flags["peer-trusted-ca-file"] == wellknown.ETCD_CA


def test_the_unit_and_the_script_pass_their_consumers(tmp_path: Path) -> None:
    files = shared.rendered("research-7500")["etcd-events-0"]
    unit = tmp_path / "etcd.service"
    unit.write_text(files[ETCD_UNIT].content)
    # the one complaint: the pinned etcd is not installed on this machine
    assert systemd_verify(tmp_path, [unit]) == [
        f"{unit.name}: Command /usr/local/bin/etcd is not executable: No such file or directory"]
    broken = tmp_path / "broken" / "etcd.service"
    broken.parent.mkdir()
    broken.write_text(files[ETCD_UNIT].content.replace("EnvironmentFile=-", "EnvironmentFiles=-"))
    assert any("Unknown key" in line and "EnvironmentFiles" in line for line in systemd_verify(broken.parent, [broken]))
    script = tmp_path / "etcd-join"
    script.write_text(files[ETCD_JOIN].content)
    for shell in ("sh", "bash"):
        syntax = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, check=False)
        assert syntax.returncode == 0, syntax.stderr
    script.write_text(files[ETCD_JOIN].content.replace("fi\n", "", 1))
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True, check=False).returncode != 0


# --- the stack's old key -------------------------------------------------------------------------

def test_the_rejoining_key_is_refused_saying_the_boot_path_does_it_now(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["events"]["rejoining"] = []
    load_stack(str(write_stack(cluster)))  # empty: accepted, so old stack files still load
    cluster["etcd"]["events"]["rejoining"] = [1]
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    [problem] = caught.value.problems
    assert problem.path == "etcd.events.rejoining", problem
    assert "rejoins by itself at boot" in problem.message and "etcd-join" in problem.message


# --- etcd-join's decisions, against a fake etcdctl -------------------------------------------

# -S: the fake needs only the standard library, and starts in a third of the time without site
FAKE_ETCDCTL = """#!{python} -S
import json, os, sys
scenario = json.load(open(os.environ["FAKE_SCENARIO"]))
args = [a for a in sys.argv[1:] if not a.startswith(("--cacert=", "--cert=", "--key=", "--dial-timeout=",
                                                     "--command-timeout="))]
endpoints = next(a.split("=", 1)[1] for a in args if a.startswith("--endpoints="))
command = [a for a in args if not a.startswith("--endpoints=")]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([endpoints, *command]) + "\\n")
if command[0] == "get":
    sys.exit(0 if endpoints in scenario["quorum"] else 1)
if command[:2] == ["member", "list"]:
    print(scenario["members"])
    sys.exit(0)
if command[:2] == ["member", "remove"]:
    sys.exit(scenario.get("remove_rc", 0))
if command[:2] == ["member", "add"]:
    tries = os.environ["FAKE_LOG"] + ".adds"
    n = int(open(tries).read()) + 1 if os.path.exists(tries) else 1
    open(tries, "w").write(str(n))
    sys.exit(1 if n <= scenario.get("add_failures", 0) else 0)
sys.exit(2)
"""
# `sleep` as etcd-join sees it: logs ["sleep", <seconds>] beside the etcdctl calls and returns at once
FAKE_SLEEP = """#!/bin/sh
printf '["sleep", "%s"]\\n' "$1" >> "$FAKE_LOG"
"""
PEERS = {i: f"https://10.0.1.{10 + i}:2380" for i in range(5)}
CLIENTS = {i: f"https://10.0.1.{10 + i}:2379" for i in range(5)}


def entry(i: int, member_id: str, *, started: bool = True, learner: bool = False, name: str | None = None) -> str:
    name = f"etcd-main-{i}" if name is None else name
    return ", ".join([member_id, "started" if name else "unstarted", name, PEERS[i],
                      CLIENTS[i] if started else "", "true" if learner else "false"])


@pytest.fixture(scope="module")
def join_script(tmp_path_factory: pytest.TempPathFactory) -> str:
    """etcd-join of etcd-main-2 of a 5-member main cluster, rendered once for the module's runs."""
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["members"] = 5
    path = tmp_path_factory.mktemp("join") / "Pulumi.test.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    return render_cluster(plan_stack(load_stack(str(path))))["etcd-main-2"][ETCD_JOIN].content


@pytest.fixture
def join(tmp_path: Path, join_script: str) -> Any:
    """Run etcd-join of etcd-main-2 of a 5-member main cluster against a fake etcdctl playing
    `scenario`; returns (exit code, output, env file or None, etcdctl calls)."""
    script = join_script
    fake = tmp_path / "etcdctl"
    fake.write_text(FAKE_ETCDCTL.replace("{python}", sys.executable))
    fake.chmod(0o755)
    local = {"DATA_DIR": tmp_path / "data", "ENV_FILE": tmp_path / "run" / "join.env",
             "READY_MARKER": tmp_path / "state" / "ready", "ETCDCTL": fake}
    for name, path in local.items():
        script = re.sub(rf"^{name}='[^']*'$", f"{name}='{path}'", script, flags=re.M)
    (tmp_path / "run").mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "data").mkdir()
    path = tmp_path / "etcd-join"
    path.write_text(script)
    path.chmod(0o755)
    # the pause between two refused adds is written down, not waited for (a second each)
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "sleep").write_text(FAKE_SLEEP)
    (shims / "sleep").chmod(0o755)

    def run(scenario: dict[str, Any], *, marker: bool = False, wal: bool = False) -> tuple[int, str, str | None, list]:
        if marker:
            (tmp_path / "state" / "ready").touch()
        if wal:
            (tmp_path / "data" / "member" / "wal").mkdir(parents=True)
            (tmp_path / "data" / "member" / "wal" / "0000000000000000-0000000000000000.wal").touch()
        (tmp_path / "scenario.json").write_text(json.dumps(scenario))
        result = subprocess.run(
            [str(path)], capture_output=True, text=True, timeout=60, check=False,
            env={"PATH": f"{shims}:{os.environ['PATH']}", "FAKE_SCENARIO": str(tmp_path / "scenario.json"),
                 "FAKE_LOG": str(tmp_path / "calls.log"), "ETCDCTL_ENDPOINTS": "https://elsewhere:2379"},
        )
        env_file = tmp_path / "run" / "join.env"
        calls_log = tmp_path / "calls.log"
        calls = [json.loads(line) for line in calls_log.read_text().splitlines()] if calls_log.exists() else []
        assert not [p.name for p in (tmp_path / "run").iterdir() if p.name != "join.env"]  # its probes cleaned
        return result.returncode, result.stderr, env_file.read_text() if env_file.exists() else None, calls

    return run


OTHERS = [CLIENTS[i] for i in (0, 1, 3, 4)]
FIVE = "\n".join(entry(i, f"{i + 1:x}" * 16) for i in range(5))


def changes(calls: list[list[str]]) -> list[list[str]]:
    return [c[1:] for c in calls if c[1] == "member" and c[2] in {"remove", "add"}]


def test_a_data_dir_that_holds_a_member_is_left_to_etcd(join: Any) -> None:
    code, output, env, calls = join({"quorum": OTHERS, "members": FIVE}, marker=True, wal=True)
    assert (code, env, calls) == (0, None, [])
    assert "the data dir holds a member" in output


def test_nobody_answering_is_a_first_bootstrap_unless_etcd_was_ready_here(join: Any) -> None:
    code, output, env, calls = join({"quorum": [], "members": ""})
    assert (code, env) == (0, None) and "bootstrapping the cluster" in output
    assert sorted(c[0] for c in calls) == sorted(OTHERS) and {c[1] for c in calls} == {"get"}
    code, output, env, _ = join({"quorum": [], "members": ""}, marker=True)
    assert (code, env) == (1, None)
    assert "not starting etcd" in output and "etcd was ready on this machine before" in output


def test_a_member_that_served_before_is_removed_and_added_anew(join: Any) -> None:
    code, output, env, calls = join({"quorum": OTHERS, "members": FIVE}, marker=True)
    assert (code, env) == (0, "ETCD_INITIAL_CLUSTER_STATE=existing\n"), output
    assert changes(calls) == [
        ["member", "remove", "3" * 16], ["member", "add", "etcd-main-2", f"--peer-urls={PEERS[2]}"]]
    # membership is asked of the members that hold quorum, and only of them
    assert {c[0] for c in calls if c[1] == "member"} == {",".join(OTHERS)}


def test_an_entry_that_never_served_is_joined_as_it_is(join: Any) -> None:
    members = FIVE.replace(entry(2, "3" * 16), entry(2, "3" * 16, started=False, name=""))
    code, output, env, calls = join({"quorum": OTHERS, "members": members}, marker=True)
    assert (code, env, changes(calls)) == (0, "ETCD_INITIAL_CLUSTER_STATE=existing\n", []), output
    assert "has never served: starting as it" in output


@pytest.mark.parametrize(("members", "expected"), [
    # no entry at all (removed by hand): added
    ("\n".join(entry(i, f"{i + 1:x}" * 16) for i in (0, 1, 3, 4)), [["member", "add"]]),
    # an unstarted learner entry (not something etcd-join adds): replaced by a voting member
    (FIVE.replace(entry(2, "3" * 16), entry(2, "3" * 16, started=False, learner=True, name="")),
     [["member", "remove"], ["member", "add"]]),
])
def test_a_missing_or_learner_entry_is_added_as_a_voting_member(join: Any, members: str, expected: list) -> None:
    code, output, env, calls = join({"quorum": OTHERS, "members": members})
    assert (code, env) == (0, "ETCD_INITIAL_CLUSTER_STATE=existing\n"), output
    assert [c[:2] for c in changes(calls)] == expected


def test_add_is_tried_again_while_etcd_refuses_it(join: Any) -> None:
    code, output, env, calls = join({"quorum": OTHERS, "members": FIVE, "add_failures": 2})
    assert (code, env) == (0, "ETCD_INITIAL_CLUSTER_STATE=existing\n"), output
    assert [c[:2] for c in changes(calls)] == [["member", "remove"]] + [["member", "add"]] * 3
    # a second between two tries
    tries = [" ".join(c if c[0] == "sleep" else c[1:3])
             for c in calls if c[0] == "sleep" or c[1:3] == ["member", "add"]]
    assert tries == ["member add", "sleep 1", "member add", "sleep 1", "member add"]


@pytest.mark.parametrize(("scenario", "says"), [
    # 2 of the 4 others answer: a 5-member cluster needs 3 without this member
    ({"quorum": OTHERS[:2], "members": FIVE}, "rejoining a cluster of 5 voting members needs 3"),
    # its name on one entry, its peer URL on another
    ({"quorum": OTHERS, "members": FIVE.replace(entry(4, "5" * 16), entry(2, "5" * 16, name="etcd-main-9"))},
     "several members carry this member's name or peer URL"),
    ({"quorum": OTHERS, "members": "Error: something else"}, "cannot read the member list"),
    ({"quorum": OTHERS, "members": FIVE, "remove_rc": 1}, "member remove 3333333333333333 failed"),
])
def test_it_refuses_rather_than_risk_quorum_or_guess(join: Any, scenario: dict[str, Any], says: str) -> None:
    code, output, env, calls = join(scenario)
    assert (code, env) == (1, None) and says in output, output
    assert not [c for c in changes(calls) if c[1] == "add"]
    if "remove_rc" not in scenario:
        assert changes(calls) == []


def test_the_fake_etcdctl_is_strict(tmp_path: Path) -> None:
    # the fake answers only what etcd-join asks; anything else fails, so a changed call is seen
    fake = tmp_path / "etcdctl"
    fake.write_text(FAKE_ETCDCTL.replace("{python}", sys.executable))
    fake.chmod(0o755)
    (tmp_path / "s.json").write_text(json.dumps({"quorum": [], "members": ""}))
    result = subprocess.run([str(fake), "--endpoints=x", "endpoint", "status"], check=False,
                            env={"FAKE_SCENARIO": str(tmp_path / "s.json"), "FAKE_LOG": str(tmp_path / "l")})
    assert result.returncode == 2
