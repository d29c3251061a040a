"""The Pulumi program: what `infra/__main__.py` runs, and what `kilonode plan` runs under mocks.

Reads `kilonode:cluster` with pulumi.Config, validates it with the same loader as the CLI,
resolves the plan, renders the hosts' artefacts, builds one Cluster and exports what a
user needs. Everything happens when `main()` is called, never at import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime.mocks
import pulumi.runtime.settings

from kilonode.azure.cluster import Cluster, ClusterArgs, etcd_endpoints_output
from kilonode.azure.custom_data_size import refuse_oversized, user_data
from kilonode.azure.deployer import Runner, deployer_problems, run_tool
from kilonode.azure.identity import subscription_of
from kilonode.azure.live import LiveReadError, live_capacities
from kilonode.azure.node_image import (
    DEFAULT_VHD_DIR,
    absent_vhds,
    default_vhd,
    gallery_images,
    image_gallery,
    vhd_digest,
)
from kilonode.azure.rollout import RESTART_KEYS_OUTPUT
from kilonode.catalog import binaries
from kilonode.config import Stack, program_stack, stack_from_value
from kilonode.config.load import project_stacks_dir
from kilonode.config.model import CONTROL_PLANE_IMAGE, ETCD_IMAGE
from kilonode.exit_codes import ExitCode
from kilonode.k8s.alertmanager import read_secrets
from kilonode.k8s.cloud_provider import AzureTarget
from kilonode.k8s.incluster import InCluster, InClusterArgs
from kilonode.plan import ClusterPlan, checked_plan
from kilonode.problems import StackError, report
from kilonode.render import render_cluster
from kilonode.render.alertmanager import alertmanager_files
from kilonode.render.dashboards import dashboard_files
from kilonode.render.monitoring import monitoring_files


def main(require_recorded_addresses: bool = True, stack_file: Path | None = None,
         live_capacities_recorded: Mapping[str, int] | None = None) -> Cluster:
    """The program. `pulumi up` runs it as is; the offline preview (`kilonode plan`) passes
    require_recorded_addresses=False to show the graph of a stack not yet allocated, and the
    stack file it loaded. Deployed, it reads the autoscaled scale sets' sizes from Azure
    (kilonode.azure.live); recorded, it has none, or `live_capacities_recorded` (a test's: the
    graph a deployment with those sizes would send)."""
    stack_name = pulumi.get_stack()
    try:
        stack = read_stack(stack_name, pulumi.Config("kilonode").get_object("cluster"), stack_file)
        plan = checked_plan(stack)
        rendered = render_cluster(plan)
        # before any resource: a custom data over Azure's cap would otherwise stop the program
        # half-way, in an apply, with a traceback
        refuse_oversized(stack, plan, user_data(rendered))
    except StackError as error:
        # RunError: Pulumi prints the message alone, without a Python traceback; bounded as every
        # command bounds a refusal.
        raise pulumi.RunError(report(error)) from None
    vhds = {image.name: default_vhd(stack.name, image.name) for image in gallery_images(plan)}
    live = _deployment_gates(stack, plan, vhds, live_capacities_recorded)
    if require_recorded_addresses and plan.network.unrecorded:
        # An unrecorded subnet could move when another pool changes (and with it static IPs
        # or scale sets): nothing gets created at an address the stack file does not hold.
        fields = ", ".join(f"{u.field} (would be {u.subnet})" for u in plan.network.unrecorded)
        raise pulumi.RunError(
            f"{stack.file}: subnets not recorded in the stack file: {fields}; run `kilonode allocate "
            f"{stack_name}`, commit the file, then `pulumi up` again"
        )
    cluster = Cluster(plan.cluster, ClusterArgs(
        plan=plan,
        rendered=rendered,
        node_image_vhds=vhds,
        # a recorded plan reads no disk images: the same graph on every machine
        node_image_digests={name: vhd_digest(path, read=not _recorded_by_mocks()) for name, path in vhds.items()},
        own_stack=f"{pulumi.get_organization()}/{pulumi.get_project()}/{stack_name}",
        live_capacities=live,
    ))
    # The in-cluster half: on the cluster's own credentials, once the apiserver answers, through
    # the endpoint the machine running `pulumi up` reaches (the stack's `deployer`).
    InCluster(f"{plan.cluster}-k8s", InClusterArgs(
        plan=plan,
        kubeconfig=cluster.tls.super_admin_kubeconfig,
        endpoint=cluster.control_plane.deployer_endpoint,
        join_tokens=cluster.tls.join_tokens,
        cloud_target=cloud_target(plan, cluster),
        monitoring_files=monitoring_files(plan),
        dashboard_files=dashboard_files(plan),
        alertmanager_files=alertmanager_files(plan),  # and its receivers' Pulumi secrets (stand-ins under mocks)
        alerting_secrets=read_secrets(plan.alerting, pulumi.Config("kilonode"), required=not _recorded_by_mocks()),
        after=(*cluster.control_plane.ready_after, *(peering.id for peering in cluster.network.deployer_peerings)),
    ))
    pulumi.export("apiserverAddress", cluster.apiserver_address)
    pulumi.export("apiserverEndpoint", plan.control_plane.endpoint)
    # what adminKubeconfig names: the public frontend for an internet deployer
    pulumi.export("deployerEndpoint", cluster.control_plane.deployer_endpoint)
    # etcdMainEndpoints, etcdEventsEndpoints, and etcdLeasesEndpoints where the stack has that cluster
    for role, endpoints in cluster.etcd_endpoints.items():
        pulumi.export(etcd_endpoints_output(role), endpoints)
    # where the etcd snapshots are (docs/runbooks/etcd-restore-from-snapshot.md): the account, and
    # each etcd cluster's container (role -> container)
    pulumi.export("etcdBackupAccount", cluster.etcd_backup_account)
    pulumi.export("etcdBackupContainers", cluster.etcd_backup_containers)
    # each etcd cluster's CA certificate (public): a snapshot's manifest must be signed by a member
    # certificate it issued, which the restore checks before it decrypts (etcdMainCaCert, ...)
    for role, cert in cluster.tls.etcd_ca_certs.items():
        pulumi.export(f"etcd{role.capitalize()}CaCert", cert)
    # Secret: the age identity that decrypts them; no VM holds it (the members encrypt to its
    # public recipient).
    pulumi.export("etcdSnapshotIdentity", cluster.etcd_snapshot_identity)
    pulumi.export("nodeImageVersionIds", cluster.image_version_ids)
    pulumi.export("scaleSetIds", cluster.scale_set_ids)
    # Secret: `pulumi stack output adminKubeconfig --show-secrets > ~/.kube/<cluster>`; its
    # identity is the kilonode:cluster-admins group, bound to cluster-admin (revocable).
    pulumi.export("adminKubeconfig", cluster.tls.admin_kubeconfig)
    # What each role's machines run, pinned (node-image/binaries.toml): shown by `kilonode plan`.
    pulumi.export("pinnedBinaries", pinned_binaries(plan))
    # Read back by the next run's restart guard (kilonode.azure.rollout); digests, no secrets.
    pulumi.export(RESTART_KEYS_OUTPUT, cluster.restart_keys)
    return cluster


def read_stack(stack_name: str, value: Any, stack_file: Path | None) -> Stack:
    """The stack this run deploys. `pulumi up`: the stack file read by the loader every kilonode
    command uses, with every check they run, at its lines (Pulumi runs the program in the
    project folder: the file is its stackConfigDir's Pulumi.<stack>.yaml), and Pulumi's own
    reading of it, `value`, the same (kilonode.config.load.program_stack). Under the mock
    engine a test may hand the program a value with no file behind it (stack_file None): that
    value is checked alone."""
    if stack_file is None and _recorded_by_mocks():
        return stack_from_value(stack_name, value, (project_stacks_dir() or Path.cwd()) / f"Pulumi.{stack_name}.yaml")
    if stack_file is None:
        stack_file = (project_stacks_dir() or Path.cwd()) / f"Pulumi.{stack_name}.yaml"
    return program_stack(stack_name, value, stack_file)


def _deployment_gates(stack: Stack, plan: ClusterPlan, vhds: dict[str, str],
                      recorded: Mapping[str, int] | None) -> dict[str, int] | None:
    """What a deployment checks and reads before it registers anything (nothing under the mock
    engine): the images built or published, the deployer's tools, preflight, and the autoscaled
    scale sets' live sizes (kilonode.azure.live), which it returns; recorded, `recorded` or None."""
    if _recorded_by_mocks():
        return dict(recorded) if recorded is not None else None
    require_vhds(stack.name, vhds, plan)
    require_deployer(plan)
    preflight_gate(stack.file)
    try:
        return live_capacities(plan)
    except LiveReadError as error:
        raise pulumi.RunError(str(error)) from None


def require_vhds(stack_name: str, vhds: dict[str, str], plan: ClusterPlan | None = None,
                 run: Runner | None = None) -> None:
    """Refuse before anything is registered when a disk image the program uploads is not built:
    otherwise its upload fails after minutes of retries (blaming role assignments) and no scale
    set is created, because every join wave waits on the whole image component. An image whose
    version is published in the gallery already needs no VHD here: its upload ran when the
    version was new and never runs again (kilonode.azure.node_image, ignoreChanges), so a later
    `pulumi up` from a machine without the VHDs (a CI runner, a colleague's laptop) goes on."""
    missing = absent_vhds(vhds)
    if missing and plan is not None:
        ask = run or run_tool
        published = {image for image, path in vhds.items() if path in missing and _published(plan, image, ask)}
        missing = [path for image, path in vhds.items() if path in missing and image not in published]
    if missing:
        raise pulumi.RunError(
            f"{len(missing)} of the {len(vhds)} disk images this stack boots are not built here and not published "
            f"in its gallery: {', '.join(missing)}. Build them with `kilonode image build {stack_name} --all --out "
            f"{DEFAULT_VHD_DIR} --fetch` (docs/azure.md, \"Running it for real\"), then `pulumi up` again; nothing "
            "was created."
        )


def _published(plan: ClusterPlan, image: str, run: Runner) -> bool:
    """Whether the gallery holds the image's current version, provisioned (asked with az as the
    signed-in identity; any failure, a missing login included, is a no: the VHD is then required)."""
    version = next((i.version for i in plan.boot_images if i.name == image), None)
    if version is None:
        return False
    answer = run(["az", "sig", "image-version", "show", "--resource-group", plan.cluster,
                  "--gallery-name", image_gallery(plan.cluster), "--gallery-image-definition", image,
                  "--gallery-image-version", version, "--query", "provisioningState", "--output", "tsv"])
    return answer.returncode == 0 and answer.stdout.strip() == "Succeeded"


def require_deployer(plan: ClusterPlan, run: Runner = run_tool) -> None:
    """Refuse before anything is registered when this machine lacks a tool, a login or a
    subscription feature the program's own steps need (kilonode.azure.deployer)."""
    uses_encryption = any(plan.encryption_at_host(size) for size in plan.vm_sizes)
    deployer = plan.network.deployer
    problems = deployer_problems(
        plan.kubernetes_version, uses_encryption, run, location=plan.location, sizes=sorted(plan.vm_sizes),
        quota=[(need.family, need.vcpus) for need in plan.vcpu_quota if need.vcpus],
        cidrs=deployer.cidrs if deployer is not None and deployer.network == "internet" else (),
        zones=plan.zones,
    )
    if problems:
        raise pulumi.RunError(
            "this machine cannot run the program's own steps; nothing was created:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n(docs/azure.md, \"Before the first run\", lists what the deployer needs)"
        )


# A real deployment waits this long for preflight (it renders and records the whole program
# under the mock engine: seconds at 7,500 nodes).
PREFLIGHT_TIMEOUT_S = 300


def _recorded_by_mocks() -> bool:
    """True while the program runs under Pulumi's mock engine (kilonode plan, preflight itself,
    the tests): it is being recorded, not deployed."""
    return isinstance(pulumi.runtime.settings.SETTINGS.monitor, pulumi.runtime.mocks.MockMonitor)


def preflight_gate(stack_file: Path, command: Sequence[str] | None = None) -> None:
    """`pulumi up` and `pulumi preview` refuse, before they register anything, when preflight
    finds a break: the same `kilonode preflight STACK` a user runs, in a child process (it
    records this program under Pulumi's mock engine, which cannot run inside a deployment).
    Its warnings are shown as the run's warnings."""
    argv = list(command or [sys.executable, "-m", "kilonode", "preflight", str(stack_file), "--format", "json"])
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=PREFLIGHT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise pulumi.RunError(f"kilonode preflight did not finish in {PREFLIGHT_TIMEOUT_S} s; run it yourself: "
                              f"kilonode preflight {stack_file}") from None
    if result.returncode not in (ExitCode.OK, ExitCode.FAILED):
        tail = " ".join(result.stderr.strip().splitlines()[-3:])
        raise pulumi.RunError(f"kilonode preflight could not check {stack_file} (exit {result.returncode}): {tail}")
    findings = json.loads(result.stdout or "[]")
    for finding in findings:
        if finding["level"] != "break":
            pulumi.log.warn(f"preflight {finding['check']}: {finding['where']}: {finding['what']} (fix: "
                            f"{finding['fix']})")
    broken = [f for f in findings if f["level"] == "break"]
    if broken:
        lines = [f"{f['check']}: {f['where']}: {f['what']}\n    fix: {f['fix']}" for f in broken]
        raise pulumi.RunError(f"preflight found {len(broken)} break(s) in the bring-up of {stack_file}; nothing was "
                              "created:\n" + "\n".join(lines) + f"\n(`kilonode preflight {stack_file}` shows them)")


def cloud_target(plan: ClusterPlan, cluster: Cluster) -> pulumi.Output[AzureTarget]:
    """Where cloud-controller-manager, the autoscaler and Azure Disk CSI's controller act (their
    azure.json). The scale sets,
    and the load balancers and public IPs Services get, are in the pools' resource group; the
    VNet and the NSG in the cluster's own. Internal frontends come from the first pool's subnet,
    Service ports open in the pools' NSG: cloud-provider-azure manages one NSG
    (securityGroupName), and every pool subnet is in that one (kilonode.azure.network says why)."""
    net, ids = cluster.network, cluster.identities
    first = plan.node_pools[0].name
    autoscaler = ids.autoscaler.client_id if ids.autoscaler is not None else None
    return pulumi.Output.all(
        ids.cloud_provider.tenant_id, net.resource_group_id, ids.node_resource_group_name, net.resource_group_name,
        net.vnet_name, net.pool_subnet_names[first], net.pool_nsg_names[first], ids.cloud_provider.client_id,
        autoscaler, ids.disk_csi.client_id,
    ).apply(lambda v: AzureTarget(
        tenant_id=v[0], subscription_id=subscription_of(v[1]), resource_group=v[2], network_resource_group=v[3],
        vnet_name=v[4], subnet_name=v[5], security_group_name=v[6], identity_client_id=v[7],
        autoscaler_identity_client_id=v[8], disk_csi_identity_client_id=v[9],
    ))


def pinned_binaries(plan: ClusterPlan) -> dict[str, Any]:
    """Per role, each upstream binary's version, URL and digest at the plan's Kubernetes
    version; a role without pins says why (its machines could not get their binaries)."""
    catalog = binaries.load()
    roles = {"etcd": [ETCD_IMAGE], "apiserver": [CONTROL_PLANE_IMAGE]} | {
        pool.role(): list(pool.binary_roles)
        for pool in plan.node_pools
    }
    # a pool may run its own Kubernetes version (nodePools[].kubernetesVersion) during a minor upgrade
    versions = {pool.role(): pool.kubernetes_version or plan.kubernetes_version for pool in plan.node_pools}
    shown: dict[str, Any] = {}
    for host_role, catalog_roles in roles.items():
        try:
            shown[host_role] = {}
            for role in catalog_roles:
                shown[host_role] |= {
                    r.name: {"version": r.version, "url": r.url, "digest": r.pin.expected}
                    for r in catalog.resolve(role, versions.get(host_role, plan.kubernetes_version))
                } | {c.name: {"version": c.version, "unpinned": c.unpinned} for c in catalog.unpinned(role)}
        except binaries.PinError as error:
            pulumi.log.warn(str(error))
            shown[host_role] = {"unpinned": str(error)}
    return shown
