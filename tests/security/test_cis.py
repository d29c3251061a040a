"""The CIS Kubernetes Benchmark v1.10, as kube-bench encodes it (tests/security/cis/), over every
shipped stack's rendered hosts and recorded cluster objects.

Each check is evaluated with kube-bench's own test semantics (tests/security/kube_bench.py) on
what its audit would print on kilonode's hosts (tests/security/cis_audit.py), or reported not
applicable offline with its reason. A failed check must be an accepted exception in the `cis:`
section of policy/security-exceptions.yaml (check id -> reason); an exception whose check no
longer fails anywhere is stale and fails the test as surely as a new failure. Manual checks
(kube-bench's WARN) that have tests are evaluated like scored ones.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.paths import REPO_ROOT
from kilonode.render.common import EndsInVariable, flag_value
from tests import shared
from tests.security import kube_bench
from tests.security.cis_audit import (
    Host,
    NotApplicable,
    file_audit,
    hosts,
    policy_audit,
    program_audit,
    proxy_audit,
    unit_flags,
)
from tests.security.kube_bench import Audit, Check
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

EXCEPTIONS = REPO_ROOT / "policy" / "security-exceptions.yaml"
# Section 1's checks of etcd's own files: on kilonode they are on the etcd hosts, not the apiservers.
ETCD_FILE_CHECKS = ("1.1.7", "1.1.8", "1.1.11", "1.1.12")


@dataclass(frozen=True)
class Outcome:
    check: str
    stack: str
    host: str  # the host, or "cluster" for section 5
    state: str  # "pass", "fail", "n/a"
    detail: str


@functools.cache
def checks() -> tuple[Check, ...]:
    return tuple(kube_bench.load_checks())


def role_of(check: Check) -> str:
    if check.id in ETCD_FILE_CHECKS or check.section == "2":
        return "etcd"
    return {"1": "apiserver", "3": "apiserver", "4": "pool"}[check.section]


def _decided(check: Check, stack: str, host: str, answer: Audit | NotApplicable) -> Outcome:
    if isinstance(answer, NotApplicable):
        return Outcome(check.id, stack, host, "n/a", answer.reason)
    passed, results = kube_bench.run(check, answer)
    detail = "; ".join(f"{item.flag or item.path}: {'found ' + repr(r.value) if r.found else 'not found'} "
                       f"({r.source})" for item, r in zip(check.items, results, strict=True))
    return Outcome(check.id, stack, host, "pass" if passed else "fail", detail)


def host_outcome(check: Check, host: Host, graph: Graph) -> Outcome:
    plan = shared.plan(host.stack)
    answer = file_audit(check, host)
    if answer is not None:
        return _decided(check, host.stack, host.name, answer)
    program = program_audit(check, host, plan, proxy_audit(graph))
    if program is None:
        raise AssertionError(f"{check.id}: its audit reads nothing cis_audit.py maps ({check.audit[:80]!r})")
    return _decided(*program[:1], host.stack, host.name, program[1])


def outcomes(stack: str, graph: Graph, only: Iterable[Check] | None = None) -> list[Outcome]:
    found: list[Outcome] = []
    stack_hosts = list(hosts(stack))
    for check in only if only is not None else checks():
        if check.manual or not check.items:
            found.append(Outcome(check.id, stack, "-", "n/a", "manual: no test kube-bench can run"))
        elif check.section == "5":
            found.append(_decided(check, stack, "cluster", policy_audit(check, graph)))
        else:
            found += [host_outcome(check, host, graph) for host in stack_hosts if host.role == role_of(check)]
    return found


def accepted() -> dict[str, str]:
    document: dict[str, Any] = shared.load_yaml(EXCEPTIONS.read_text())
    return {str(k): str(v) for k, v in (document.get("cis") or {}).items()}


def summary(found: list[Outcome]) -> dict[str, str]:
    """check id -> "fail" if it fails on any stack or host, else "pass" if evaluated, else "n/a"."""
    states: dict[str, set[str]] = {}
    for o in found:
        states.setdefault(o.check, set()).add(o.state)
    return {c: "fail" if "fail" in s else "pass" if "pass" in s else "n/a" for c, s in states.items()}


@pytest.fixture(scope="module")
def all_outcomes(graphs: dict[str, Graph]) -> list[Outcome]:
    return [o for stack in SHIPPED_STACKS for o in outcomes(stack, graphs[stack])]


def test_every_failed_cis_check_is_an_accepted_exception_and_every_exception_still_fails(
    all_outcomes: list[Outcome],
) -> None:
    states = summary(all_outcomes)
    exceptions = accepted()
    new = sorted({f"{o.check} {o.stack}/{o.host}: {o.detail}" for o in all_outcomes
                  if o.state == "fail" and o.check not in exceptions})
    stale = sorted(c for c in exceptions if states.get(c) != "fail")
    assert not new, "CIS checks failing without an accepted exception (fix or list in cis:):\n" + "\n".join(new)
    assert not stale, f"cis: exceptions whose check no longer fails (remove them): {stale}"


def test_every_benchmark_check_has_an_outcome_on_every_stack(all_outcomes: list[Outcome]) -> None:
    ids = {c.id for c in checks()}
    for stack in SHIPPED_STACKS:
        assert {o.check for o in all_outcomes if o.stack == stack} == ids, stack
    assert len(ids) == len(checks()), "duplicate check ids in the vendored benchmark"
    # the not-applicable ones say why
    assert all(o.detail for o in all_outcomes if o.state == "n/a")


def test_every_exception_names_a_benchmark_check_with_a_reason() -> None:
    ids = {c.id for c in checks()}
    for check, reason in accepted().items():
        assert check in ids, f"cis: {check} is not a check of the vendored benchmark"
        assert len(reason.split()) >= 8, f"cis: {check}: say why, precisely"


def test_the_rendered_units_run_the_flags_the_checks_read() -> None:
    """The command lines audited are the renderers' flag lists; the units run exactly those
    (a value systemd completes at start, EndsInVariable, is compared by its literal part)."""
    for stack in SHIPPED_STACKS:
        for host in hosts(stack):
            for program, flags in host.flags.items():
                expected = {name: value.literal if isinstance(value, EndsInVariable) else flag_value(value)
                            for name, value in flags}
                running = {name: value.split("${", 1)[0] for name, value in unit_flags(host, program).items()}
                assert running == expected, (stack, host.name, program)


# ---------------------------------------------------------------- seeded breaks

def _check(check_id: str) -> Check:
    return next(c for c in checks() if c.id == check_id)


def _one_host(stack: str, role: str) -> Host:
    return next(h for h in hosts(stack) if h.role == role)


def test_alwaysallow_authorization_fails_1_2_6(graphs: dict[str, Graph]) -> None:
    host = _one_host("local", "apiserver")
    host.flags["kube-apiserver"] = [(n, "AlwaysAllow" if n == "authorization-mode" else v)
                                    for n, v in host.flags["kube-apiserver"]]
    assert host_outcome(_check("1.2.6"), host, graphs["local"]).state == "fail"
    assert host_outcome(_check("1.2.7"), host, graphs["local"]).state == "fail"


def test_anonymous_kubelet_fails_4_2_1_through_its_config_file(graphs: dict[str, Graph]) -> None:
    from kilonode.render.files import RenderedFile
    from kilonode.render.pool import KUBELET_CONFIG
    host = _one_host("local", "pool")
    text = host.files[KUBELET_CONFIG].content.replace("anonymous:\n    enabled: false", "anonymous:\n    enabled: true")
    assert text != host.files[KUBELET_CONFIG].content
    host.files = {**host.files, KUBELET_CONFIG: RenderedFile(text)}
    outcome = host_outcome(_check("4.2.1"), host, graphs["local"])
    assert (outcome.state, "config") == ("fail", outcome.detail.rsplit("(", 1)[1].rstrip(")"))


def test_a_world_readable_unit_fails_1_1_1(graphs: dict[str, Graph]) -> None:
    host = _one_host("local", "apiserver")
    unit = "/etc/systemd/system/kube-apiserver.service"
    host.written = {**host.written, unit: ("644", "root:root")}
    assert host_outcome(_check("1.1.1"), host, graphs["local"]).state == "fail"


def test_scheduler_profiling_is_read_from_its_config_file(graphs: dict[str, Graph]) -> None:
    """kube-scheduler ignores --profiling with --config (upstream_flags.toml): 1.4.1 reads
    enableProfiling, and fails when the file turns it on, whatever the flags say."""
    from kilonode.render.control_plane import SCHEDULER_CONFIG
    from kilonode.render.files import RenderedFile
    host = _one_host("local", "apiserver")
    assert host_outcome(_check("1.4.1"), host, graphs["local"]).state == "pass"
    text = host.files[SCHEDULER_CONFIG].content.replace("enableProfiling: false", "enableProfiling: true")
    host.files = {**host.files, SCHEDULER_CONFIG: RenderedFile(text)}
    host.flags["kube-scheduler"] = [*host.flags["kube-scheduler"], ("profiling", False)]
    assert host_outcome(_check("1.4.1"), host, graphs["local"]).state == "fail"


def test_a_privileged_container_fails_5_2_2(graphs: dict[str, Graph]) -> None:
    graph = graphs["local"]
    record = next(r for r in graph.resources if r.name.endswith("approver-deployment"))
    inputs = record.plain()
    inputs["spec"]["template"]["spec"]["containers"][0].setdefault("securityContext", {})["privileged"] = True
    broken = Graph(stack=graph.stack, resources=[replace(record, inputs=inputs) if r is record else r
                                                 for r in graph.resources])
    assert outcomes("local", graph, [_check("5.2.2")])[0].state in ("pass", "fail")
    failed = outcomes("local", broken, [_check("5.2.2")])[0]
    assert failed.state == "fail"
