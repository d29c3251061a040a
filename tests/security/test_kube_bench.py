"""kube_bench.py against the behaviour of kube-bench's check/test.go it ports (cases from its
compareOp and findValue branches)."""

from __future__ import annotations

import pytest

from tests.security.kube_bench import Audit, Check, TestItem, compare, find_flag, find_path, run


@pytest.mark.parametrize(("op", "found", "expected", "result"), [
    ("bitmask", "600", "600", True),
    ("bitmask", "400", "600", True),
    ("bitmask", "644", "600", False),
    ("bitmask", "700", "600", False),
    ("eq", "FALSE", "false", True),  # booleans compare case-insensitively
    ("eq", "Node", "node", False),  # other values do not
    ("noteq", "false", "false", False),
    ("gte", "30", "30", True),
    ("gte", "thirty", "30", False),  # not a number: fails
    ("has", "Node,RBAC", "RBAC", True),
    ("nothave", "Node,RBAC", "AlwaysAllow", True),
    ("valid_elements", "a,b,", "a,b,c", True),
    ("valid_elements", "a,d", "a,b,c", False),
    ("valid_elements", "", "a,b,c", False),
    ("regex", "127.0.0.1:10249", r"127\.0\.0\.1", True),
])
def test_compare_ops_follow_kube_bench(op: str, found: str, expected: str, result: bool) -> None:
    assert compare(op, found, expected) is result


def test_flags_are_found_as_kube_bench_finds_them() -> None:
    assert find_flag("--profiling", "kube-apiserver --profiling=false --x=1") == (True, "false")
    assert find_flag("--bool-flag", "prog --bool-flag --x=1") == (True, "true")
    assert find_flag("root:root", "root:root") == (True, "root:root")
    assert find_flag("--absent", "prog --x=1") == (False, "")


def test_config_paths_print_as_client_go_jsonpath() -> None:
    document = {"authentication": {"anonymous": {"enabled": False}}, "readOnlyPort": 0, "tlsCipherSuites": ["A", "B"]}
    assert find_path("{.authentication.anonymous.enabled}", document) == (True, "false")
    assert find_path("{.readOnlyPort}", document) == (True, "0")
    assert find_path("{.missing.key}", document) == (False, "")
    assert find_path("{range .tlsCipherSuites[:]}{}{','}{end}", document) == (True, "A,B,")


def _check(*items: TestItem, bin_op: str = "", multiple: bool = False) -> Check:
    return Check("9.9", "test", "", True, "", "", "", multiple, bin_op, items)


def test_set_false_or_a_value_and_the_config_fallback() -> None:
    check = _check(TestItem("--read-only-port", path="{.readOnlyPort}", op="eq", value="0"),
                   TestItem("--read-only-port", path="{.readOnlyPort}", set=False), bin_op="or")
    assert run(check, Audit("kubelet --config=x", {}))[0]  # unset anywhere: passes
    assert run(check, Audit("kubelet --config=x", {"readOnlyPort": 0}))[0]
    assert not run(check, Audit("kubelet --config=x", {"readOnlyPort": 10255}))[0]
    # the command line is read first: a flag overrides the file, as in the kubelet
    assert not run(check, Audit("kubelet --read-only-port=10255", {"readOnlyPort": 0}))[0]


def test_every_line_must_pass_with_multiple_values() -> None:
    check = _check(TestItem("permissions", op="bitmask", value="600"), multiple=True)
    assert run(check, Audit("permissions=600\npermissions=400"))[0]
    assert not run(check, Audit("permissions=600\npermissions=644"))[0]
