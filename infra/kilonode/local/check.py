"""The rendered kube-apiserver etcd flags, checked against the clusters that run.

kube-apiserver itself is in no registry this machine reaches, so the rehearsal does what it
would do first: reach every endpoint of `--etcd-servers` and of each entry of
`--etcd-servers-overrides` (`/events`, and `coordination.k8s.io/leases` where the stack has the
leases cluster) over TLS, with the files its `--etcd-cafile`, `--etcd-certfile` and
`--etcd-keyfile` name (as the PKI layout delivers them to its host), and asks each which
cluster it belongs to (`etcdctl endpoint status`: header.cluster_id). The expected cluster IDs
come from the members themselves, not from the renderer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kilonode.local.etcd import ClientTls, endpoint_status
from kilonode.local.units import UnitError, etcd_servers, etcd_servers_overrides, flag, local_addresses, unit_flags
from kilonode.plan.wellknown import ETCD_OVERRIDE_RESOURCES

# role -> what would share the main cluster without its override
HOLDS = {"events": "Events", "leases": "every Lease"}


@dataclass(frozen=True)
class EndpointCheck:
    flag: str  # --etcd-servers, or --etcd-servers-overrides=/events# (or =coordination.k8s.io/leases#)
    rendered: str  # the URL as rendered (Azure address)
    local: str  # the URL reached here
    expected: str  # the cluster it should belong to: main | events | leases
    found: str | None = None  # the cluster it answered for (None: no answer, or an unknown cluster)
    cluster_id: int | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ApiserverCheck:
    host: str
    tls: ClientTls | None
    endpoints: tuple[EndpointCheck, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_apiserver_etcd(
    unit: str,
    host: str,
    addresses: Mapping[str, str],
    host_files: Mapping[str, Path],
    cluster_ids: Mapping[str, int],
    member_urls: Mapping[str, Sequence[str]],
) -> ApiserverCheck:
    """Check one apiserver's rendered unit.

    `host_files`: the host path -> local file of every file the PKI layout delivers to
    `host`; `cluster_ids`: each cluster's role (main, events, leases) -> the ID its members
    report; `member_urls`: each role -> its members' local client URLs (each should be listed).
    Every cluster but main must have its entry in --etcd-servers-overrides, and no entry may
    name a resource whose cluster does not run.
    """
    problems: list[str] = []
    try:
        flags = unit_flags(unit, f"{host}/kube-apiserver.service")
        files = {name: flag(flags, name) for name in ("etcd-cafile", "etcd-certfile", "etcd-keyfile")}
        wanted = {"--etcd-servers": ("main", etcd_servers(flag(flags, "etcd-servers")))}
        overrides = etcd_servers_overrides(flag(flags, "etcd-servers-overrides"))
    except UnitError as error:
        return ApiserverCheck(host, None, (), (str(error),))
    roles = {resource: role for role, resource in ETCD_OVERRIDE_RESOURCES.items()}
    for role in member_urls:
        resource = ETCD_OVERRIDE_RESOURCES.get(role)
        if resource is None:
            continue  # main: --etcd-servers
        if resource in overrides:
            wanted[f"--etcd-servers-overrides={resource}#"] = (role, overrides[resource])
        else:
            problems.append(f"--etcd-servers-overrides has no {resource} entry: {HOLDS[role]} would share the "
                            "main cluster")
    for resource in overrides:
        if roles.get(resource) not in member_urls:
            problems.append(f"--etcd-servers-overrides names {resource}, but no cluster for it runs here")
    missing = [f"--{name}={path}" for name, path in files.items() if path not in host_files]
    if missing:
        return ApiserverCheck(host, None, (), (
            f"{', '.join(missing)}: the PKI layout delivers no such file to {host}",
        ))
    tls = ClientTls(host_files[files["etcd-cafile"]], host_files[files["etcd-certfile"]],
                    host_files[files["etcd-keyfile"]])
    if len(set(cluster_ids.values())) != len(cluster_ids):
        problems.append(f"the {', '.join(cluster_ids)} members report {len(set(cluster_ids.values()))} cluster IDs "
                        "between them: two of them formed one cluster")
    by_id = {cluster_id: role for role, cluster_id in cluster_ids.items()}

    planned = [(name, role, url, local_addresses(url, addresses)) for name, (role, urls) in wanted.items()
               for url in urls]
    statuses = endpoint_status([local for *_, local in planned], tls)
    checks = []
    for (name, role, url, local), status in zip(planned, statuses, strict=True):
        where = url if url == local else f"{url} (here {local})"
        if status.error is not None:
            problem = (f"{name} lists {where}, which does not answer over TLS with the apiserver's etcd client "
                       f"certificate and CA bundle: {status.error}")
            checks.append(EndpointCheck(name, url, local, role, problem=problem))
            continue
        found = by_id.get(status.cluster_id) if status.cluster_id is not None else None
        problem = None
        if found != role:
            belongs = f"the {found} cluster" if found else f"a cluster that is none of {', '.join(cluster_ids)}"
            problem = (f"{name} lists {where}, a member of {belongs} (cluster ID {status.cluster_id:x}), "
                       f"not of the {role} cluster")
        checks.append(EndpointCheck(name, url, local, role, found, status.cluster_id, problem))
    problems += [c.problem for c in checks if c.problem]
    for name, (role, _) in wanted.items():
        listed = {c.local for c in checks if c.flag == name}
        left_out = [url for url in member_urls.get(role, ()) if url not in listed]
        if left_out:
            problems.append(f"{name} leaves out {role} member(s) {', '.join(left_out)}")
    return ApiserverCheck(host, tls, tuple(checks), tuple(problems))
