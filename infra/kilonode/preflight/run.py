"""The checks, by their stable names, and running them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kilonode.preflight.model import Finding, Inputs


@dataclass(frozen=True)
class Check:
    name: str  # stable: findings, JSON and seeded-break tests name it
    title: str  # one line: what chain it follows
    run: Callable[[Inputs], list[Finding]]


def _registry() -> tuple[Check, ...]:
    # Imported here, in the order the report lists them (the order of a machine's bring-up):
    # who reaches whom, what runs, what a GPU pod gets, what resolves, what schedules, what fits, what Azure takes.
    from kilonode.preflight.checks import (
        admission_config,
        admission_requests,
        agent_writes,
        alertmanager,
        api_validation,
        azure_names,
        balloon_priority,
        binaries,
        boot_pulls,
        component_flags,
        connections,
        contracts,
        controller_clients,
        custom_data_size,
        deployer_path,
        disks,
        encryption_at_host,
        etcd_backups,
        etcd_config,
        gpu_runtime,
        identities,
        kubelet_config,
        listeners,
        node_join,
        node_writers,
        pod_dns,
        pod_egress,
        pod_isolation,
        pod_security,
        port_range,
        probe_anonymous,
        prometheus_load,
        quota,
        rdma,
        scheduling,
        scrape_path,
        service_path,
        storage_access,
    )

    return tuple(
        Check(module.NAME, module.TITLE, module.check)
        for module in (deployer_path, connections, service_path, probe_anonymous, scrape_path, binaries, gpu_runtime,
                       contracts,
                       pod_dns, pod_isolation, pod_egress, pod_security, scheduling, balloon_priority, rdma, disks,
                       prometheus_load, alertmanager,
                       api_validation, azure_names,
                       custom_data_size, identities, storage_access, listeners, etcd_backups, etcd_config,
                       encryption_at_host,
                       port_range, node_join, node_writers, admission_config, admission_requests, agent_writes, quota,
                       boot_pulls, kubelet_config, component_flags, controller_clients)
    )


CHECKS: tuple[Check, ...] = _registry()


def run(inputs: Inputs, only: Sequence[str] = ()) -> list[Finding]:
    """Every check's findings (only the named checks, when given), breaks first, each check's
    in its own order."""
    unknown = sorted(set(only) - {c.name for c in CHECKS})
    if unknown:
        raise ValueError(f"no check named {', '.join(unknown)} (checks: {', '.join(c.name for c in CHECKS)})")
    findings = [f for c in CHECKS if not only or c.name in only for f in c.run(inputs)]
    return sorted(findings, key=lambda f: f.level != "break")


def breaks(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "break"]
