"""Grafana: the dashboards kilonode renders from the plan (kilonode.render.dashboards), beside the
cluster's Prometheus in the `monitoring` namespace, on Prometheus's pool (docs/monitoring.md,
"Dashboards").

Grafana OSS (catalogue components.yaml, grafana) provisioned from files, as Grafana's documentation
at v13.0 "Provision Grafana" describes: a data source file naming the in-cluster Prometheus Service
(made default, not editable), and a dashboard provider of type file reading a ConfigMap of the
dashboards' JSON, which Grafana re-reads every updateIntervalSeconds (a dashboard change reaches it
without a restart; the data source file is read at start only, so the pod template carries the
digest of both ConfigMaps and a change rolls the pod).

No anonymous access and no sign-up; the admin password is a generated Pulumi secret (a
RandomPassword: pulumi-random marks its result secret, so the state holds it encrypted) in the
Secret `grafana-admin`, read by Grafana from the mounted file (GF_SECURITY_ADMIN_PASSWORD__FILE: the
__FILE form of an override, "Configure a Grafana Docker image" at v13.3), never from the environment.
Grafana's own database (sqlite: users, preferences) is an emptyDir: everything it shows is
provisioned, so a new pod loses nothing kilonode made; the root filesystem is read-only.

Reached with `kubectl -n monitoring port-forward svc/grafana 3000`; in-cluster, only from its own
namespace (a NetworkPolicy like Prometheus's). It calls no API of the cluster: no token mounted.

The files come rendered from the caller: a kilonode.k8s module takes rendered files, it does not
render them (tests/test_structure.py: layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_random as random
from pulumi_kubernetes import apps, core, meta

from kilonode.k8s.gpu import POOL_LABEL
from kilonode.k8s.monitoring import (
    CONFIG_MAP_MAX_BYTES,
    LABELS,
    NAMESPACE,
    PROMETHEUS,
    _toleration,
    config_map_size,
)
from kilonode.k8s.network_policy import PROMETHEUS_PORT, same_namespace_port
from kilonode.k8s.pod_security import container_security_context, pod_security_context
from kilonode.k8s.pods import awaited, config_digest_annotation
from kilonode.plan.model import AwaitsPlan, PrometheusPlan
from kilonode.yamlio import plain_yaml

GRAFANA = "grafana"  # the Deployment and its Service
GRAFANA_LABELS = {"app.kubernetes.io/name": GRAFANA, "app.kubernetes.io/managed-by": "kilonode"}
GRAFANA_PORT = 3000  # the image's EXPOSE and Grafana's default http_port
# The image's user: grafana, UID 472 (packaging/docker/Dockerfile, ARG GF_UID="472").
GRAFANA_UID = 472
# The image's paths (GF_PATHS_DATA, GF_PATHS_PROVISIONING in packaging/docker/Dockerfile).
DATA_DIR = "/var/lib/grafana"
PROVISIONING_DIR = "/etc/grafana/provisioning"
# Where the dashboards' ConfigMap is mounted and the file provider reads.
DASHBOARDS_DIR = "/etc/grafana/dashboards/kilonode"
SECRETS_DIR = "/etc/grafana/secrets"
ADMIN_SECRET = "grafana-admin"
ADMIN_PASSWORD_KEY = "admin-password"
ADMIN_USER = "admin"
PROVISIONING_CONFIG_MAP = "grafana-provisioning"
DASHBOARDS_CONFIG_MAP = "grafana-dashboards"
DATASOURCE_FILE = "datasources.yaml"
PROVIDER_FILE = "dashboards.yaml"
DATASOURCE_NAME = "Prometheus (kilonode)"
DATASOURCE_UID = "kilonode-prometheus"
# How often the file provider looks for changed dashboards ("Provision Grafana": updateIntervalSeconds,
# default 10): a ConfigMap change reaches the mounted files within the kubelet's sync, a minute or so.
DASHBOARD_RELOAD_S = 30
# An estimate: Grafana serving a handful of people the provisioned dashboards, on sqlite; its
# queries run in Prometheus, whose own limits bound them (kilonode.k8s.monitoring --query.*).
REQUESTS = {"cpu": "100m", "memory": "256Mi"}
LIMITS = {"memory": "512Mi"}


@dataclass(frozen=True)
class GrafanaArgs:
    # file name -> dashboard JSON (kilonode.render.dashboards.dashboard_files): the ConfigMap's data
    dashboards: Mapping[str, str] = field(default_factory=dict)
    prometheus: PrometheusPlan | None = None  # the plan's: Grafana runs on its pool (required)
    image: str = ""  # the plan's (components.grafana_image)
    awaits: AwaitsPlan | None = None


def environment() -> dict[str, str]:
    """Grafana's settings as GF_<SECTION>_<KEY> overrides ("Configure a Grafana Docker image")."""
    return {
        "GF_SECURITY_ADMIN_USER": ADMIN_USER,
        "GF_SECURITY_ADMIN_PASSWORD__FILE": f"{SECRETS_DIR}/{ADMIN_PASSWORD_KEY}",
        # [auth.anonymous] enabled: no one reads the cluster's figures without signing in
        "GF_AUTH_ANONYMOUS_ENABLED": "false",
        "GF_USERS_ALLOW_SIGN_UP": "false",
        # no calls home from the cluster: usage reports, update checks, the plugin preinstaller
        # (Grafana 12 and later install plugins at start unless [plugins] preinstall_disabled)
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
        "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
        "GF_PLUGINS_PREINSTALL_DISABLED": "true",
        # the log to stdout only: the root filesystem is read-only (no /var/log/grafana)
        "GF_LOG_MODE": "console",
        "GF_PATHS_DATA": DATA_DIR,
        "GF_PATHS_PROVISIONING": PROVISIONING_DIR,
    }


def datasource_file(prometheus_url: str) -> str:
    """The data source ("Provision Grafana", "Data sources": apiVersion 1, `datasources`)."""
    return plain_yaml({"apiVersion": 1, "datasources": [{
        "name": DATASOURCE_NAME, "uid": DATASOURCE_UID, "type": "prometheus", "access": "proxy",
        "url": prometheus_url, "isDefault": True, "editable": False,
        # POST: a long panel query (the Xid classes) stays out of the URL
        "jsonData": {"httpMethod": "POST"},
    }]})


def provider_file() -> str:
    """The dashboard provider ("Provision Grafana", "Dashboards": `providers` of type file)."""
    return plain_yaml({"apiVersion": 1, "providers": [{
        "name": "kilonode", "orgId": 1, "folder": "kilonode", "type": "file",
        # what the files say is what Grafana shows: no edits in the UI that the next load would undo
        "disableDeletion": True, "allowUiUpdates": False, "updateIntervalSeconds": DASHBOARD_RELOAD_S,
        "options": {"path": DASHBOARDS_DIR, "foldersFromFilesStructure": False},
    }]})


def prometheus_url(namespace: str) -> str:
    return f"http://{PROMETHEUS}.{namespace}.svc:{PROMETHEUS_PORT}"


def _mount(name: str, path: str) -> core.v1.VolumeMountArgs:
    return core.v1.VolumeMountArgs(name=name, mount_path=path, read_only=True)


def grafana_pod(args: GrafanaArgs, provisioning: core.v1.ConfigMap, dashboards: core.v1.ConfigMap,
                secret: core.v1.Secret) -> core.v1.PodSpecArgs:
    p = args.prometheus
    assert p is not None
    health = core.v1.HTTPGetActionArgs(path="/api/health", port="http")

    def items(key: str) -> list[core.v1.KeyToPathArgs]:
        return [core.v1.KeyToPathArgs(key=key, path="kilonode.yaml")]

    return core.v1.PodSpecArgs(
        automount_service_account_token=False,  # Grafana calls no API of the cluster
        node_selector={POOL_LABEL: p.pool},
        tolerations=[_toleration(taint) for taint in p.pool_taints],
        security_context=pod_security_context(run_as_non_root=True, run_as_user=GRAFANA_UID,
                                               run_as_group=GRAFANA_UID, fs_group=GRAFANA_UID),
        containers=[core.v1.ContainerArgs(
            name=GRAFANA,
            image=args.image,
            env=[core.v1.EnvVarArgs(name=k, value=v) for k, v in environment().items()],
            ports=[core.v1.ContainerPortArgs(name="http", container_port=GRAFANA_PORT, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(requests=REQUESTS, limits=LIMITS),
            readiness_probe=core.v1.ProbeArgs(http_get=health, period_seconds=10),
            liveness_probe=core.v1.ProbeArgs(http_get=health, initial_delay_seconds=60, timeout_seconds=30,
                                             failure_threshold=10),
            security_context=container_security_context(GRAFANA_UID),
            volume_mounts=[
                core.v1.VolumeMountArgs(name="data", mount_path=DATA_DIR),
                # backend plugins and sqlite write temporary files; the root is read-only
                core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                _mount("datasources", f"{PROVISIONING_DIR}/datasources"),
                _mount("providers", f"{PROVISIONING_DIR}/dashboards"),
                _mount("dashboards", DASHBOARDS_DIR),
                _mount("admin", SECRETS_DIR),
            ],
        )],
        volumes=[
            core.v1.VolumeArgs(name="data", empty_dir=core.v1.EmptyDirVolumeSourceArgs()),
            core.v1.VolumeArgs(name="tmp", empty_dir=core.v1.EmptyDirVolumeSourceArgs()),
            core.v1.VolumeArgs(name="datasources", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=provisioning.metadata.name, items=items(DATASOURCE_FILE))),
            core.v1.VolumeArgs(name="providers", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=provisioning.metadata.name, items=items(PROVIDER_FILE))),
            core.v1.VolumeArgs(name="dashboards", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=dashboards.metadata.name)),
            core.v1.VolumeArgs(name="admin", secret=core.v1.SecretVolumeSourceArgs(
                secret_name=secret.metadata.name, default_mode=0o440)),
        ],
    )


class Grafana(pulumi.ComponentResource):
    def __init__(self, name: str, args: GrafanaArgs, namespace: core.v1.Namespace,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Grafana", name, None, opts)
        if args.prometheus is None or not args.image or args.awaits is None or not args.dashboards:
            raise ValueError("Grafana: prometheus, image, awaits and dashboards are required")
        if (size := config_map_size(args.dashboards)) > CONFIG_MAP_MAX_BYTES:
            raise ValueError(f"Grafana: the dashboards' {size} bytes exceed a ConfigMap's {CONFIG_MAP_MAX_BYTES}")
        child = pulumi.ResourceOptions(parent=self)
        ns = namespace.metadata.name
        labels = {**LABELS, **GRAFANA_LABELS}
        # its port from its own namespace, as Prometheus's (kilonode.k8s.monitoring's default-deny)
        same_namespace_port(f"{name}-allow-grafana", ns, LABELS, GRAFANA_PORT, child)
        password = random.RandomPassword(f"{name}-admin-password", length=32, special=False, opts=child)
        secret = core.v1.Secret(f"{name}-admin", metadata=meta.v1.ObjectMetaArgs(
            name=ADMIN_SECRET, namespace=ns, labels=labels),
            string_data={ADMIN_PASSWORD_KEY: password.result}, opts=child)
        files = {DATASOURCE_FILE: datasource_file(prometheus_url(NAMESPACE)),
                 PROVIDER_FILE: provider_file()}
        provisioning = core.v1.ConfigMap(f"{name}-provisioning", metadata=meta.v1.ObjectMetaArgs(
            name=PROVISIONING_CONFIG_MAP, namespace=ns, labels=labels), data=files, opts=child)
        dashboards = core.v1.ConfigMap(f"{name}-dashboards", metadata=meta.v1.ObjectMetaArgs(
            name=DASHBOARDS_CONFIG_MAP, namespace=ns, labels=labels), data=dict(args.dashboards), opts=child)
        core.v1.Service(f"{name}-service", metadata=meta.v1.ObjectMetaArgs(name=GRAFANA, namespace=ns, labels=labels),
                        spec=core.v1.ServiceSpecArgs(selector=GRAFANA_LABELS, ports=[core.v1.ServicePortArgs(
                            name="http", port=GRAFANA_PORT, target_port="http")]),
                        opts=awaited(child, args.awaits))
        apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta.v1.ObjectMetaArgs(name=GRAFANA, namespace=ns, labels=labels),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=1,  # its state is the files: a second replica would add nothing to show
                selector=meta.v1.LabelSelectorArgs(match_labels=GRAFANA_LABELS),
                template=core.v1.PodTemplateSpecArgs(
                    # the data source file is read at start only, so a change to it rolls the pod; so
                    # does a dashboard's (the digest is of everything the pod mounts): a restart costs
                    # Grafana seconds, its state being these files, and shows the change at once
                    metadata=meta.v1.ObjectMetaArgs(labels=labels, annotations=config_digest_annotation(
                        {**args.dashboards, **files})),
                    spec=grafana_pod(args, provisioning, dashboards, secret))),
            # its pool's node may still be joining on a first `pulumi up`
            opts=awaited(child, args.awaits))
        self.register_outputs({})
