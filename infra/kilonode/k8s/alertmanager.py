"""Alertmanager: where the cluster's Prometheus sends its alerts, beside it in the `monitoring`
namespace, on Prometheus's pool (docs/monitoring.md, "Alertmanager").

One replica of Alertmanager (catalogue components.yaml alertmanager, prometheus/alertmanager v0.34.0)
in a StatefulSet, HA mode off (--cluster.listen-address empty: no gossip port). One, not a peered
pair: the alerts come from one Prometheus on the same pool (kilonode.k8s.monitoring), so a second
Alertmanager would not outlive the loss of the node or pool that silences both; Prometheus sends
every firing alert again each minute, so a restarted Alertmanager has them back within one
(kilonode.render.monitoring.alerting_config); and a pair would add the gossip port (9094, TCP and
UDP) to every policy and a per-replica `alerting:` target list for no real gain here.

Its data directory (/alertmanager: silences and the notification log, written every
--data.maintenance-interval, 15m, and at shutdown; cmd/alertmanager/main.go l.54 at v0.34.0) is a
small claim, not an emptyDir: a silence set during an incident survives the pod's restart or move
to another node, and the notification log keeps a restarted Alertmanager from paging again for
what it already sent.

The configuration (alertmanager.yml, kilonode.render.alertmanager) is a ConfigMap and names its
secrets as files (routing_key_file, credentials_file) in the Secret `alertmanager-receivers`, which
holds the stack's Pulumi secrets (read by the program: read_secrets). Alertmanager reloads its
configuration only on SIGHUP or POST /-/reload, so the pod template carries the ConfigMap's digest
and a change rolls the pod (its claim keeps the silences). The secrets are read from their files at
each notification (notify/pagerduty/pagerduty.go l.226 at v0.34.0: os.ReadFile(RoutingKeyFile)), so
a rotated key needs no restart.

Hardened as Prometheus: user nobody (65534, the image's USER), runAsNonRoot, seccomp RuntimeDefault,
read-only root, every capability dropped, no ServiceAccount token (it calls no API of the cluster).
Port 9093 admits Prometheus (alerts, its scrape) and Grafana (reading alerts and silences) alone.

The files come rendered from the caller: a kilonode.k8s module takes rendered files, it does not
render them (tests/test_structure.py: layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_kubernetes import apps, core, meta, networking

from kilonode.k8s.gpu import POOL_LABEL
from kilonode.k8s.grafana import GRAFANA_LABELS
from kilonode.k8s.monitoring import LABELS, PROMETHEUS_LABELS, _toleration
from kilonode.k8s.pod_security import container_security_context, pod_security_context
from kilonode.k8s.pods import awaited, config_digest_annotation
from kilonode.k8s.storage import PREMIUM_RETAIN_CLASS
from kilonode.plan import defaults
from kilonode.plan.model import AlertingPlan, AwaitsPlan, PrometheusPlan

ALERTMANAGER = defaults.ALERTMANAGER_NAME  # the StatefulSet, its Service and ConfigMap
ALERTMANAGER_LABELS = {"app.kubernetes.io/name": ALERTMANAGER, "app.kubernetes.io/managed-by": "kilonode"}
ALERTMANAGER_PORT = defaults.ALERTMANAGER_PORT
# The image's user: `USER nobody` (prometheus/alertmanager Dockerfile at v0.34.0, on the busybox base
# whose passwd has nobody:x:65534:65534); named by UID so the kubelet can check runAsNonRoot.
ALERTMANAGER_UID = 65534
DATA_DIR = "/alertmanager"  # the image's VOLUME and WORKDIR, and its CMD's --storage.path
DATA_VOLUME = "data"  # the claim template: each pod's claim is `data-alertmanager-0`
CONFIG_DIR = defaults.ALERTMANAGER_CONFIG_DIR
CONFIG_FILE = defaults.ALERTMANAGER_CONFIG_FILE
SECRETS_DIR = defaults.ALERTMANAGER_SECRETS_DIR
RECEIVERS_SECRET = "alertmanager-receivers"
# Which Secret key (a file in SECRETS_DIR) holds which Pulumi secret config key (namespace kilonode).
SECRET_KEYS = {
    defaults.ALERTMANAGER_PAGERDUTY_KEY_FILE: defaults.ALERTMANAGER_PAGERDUTY_KEY_CONFIG,
    defaults.ALERTMANAGER_WEBHOOK_TOKEN_FILE: defaults.ALERTMANAGER_WEBHOOK_TOKEN_CONFIG,
}


@dataclass(frozen=True)
class AlertmanagerArgs:
    # file name -> text (kilonode.render.alertmanager.alertmanager_files): the ConfigMap's data
    files: Mapping[str, str] = field(default_factory=dict)
    prometheus: PrometheusPlan | None = None  # the plan's: Alertmanager runs on its pool (required)
    alerting: AlertingPlan | None = None  # the plan's: which secrets it needs
    image: str = ""  # the plan's (components.alertmanager_image)
    awaits: AwaitsPlan | None = None
    # Secret key (SECRET_KEYS) -> its value, a Pulumi secret (read_secrets)
    secrets: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)


def needed_secrets(alerting: AlertingPlan | None) -> list[str]:
    """The Secret keys (files) alertmanager.yml names for this plan."""
    if alerting is None:
        return []
    return ([defaults.ALERTMANAGER_PAGERDUTY_KEY_FILE] if alerting.pager_duty else []) + \
        ([defaults.ALERTMANAGER_WEBHOOK_TOKEN_FILE] if alerting.webhook_bearer_token else [])


def checked_secret(key: str, value: str) -> str:
    """`value` as the file will hold it, or ValueError naming the config key (never the value):
    1 to ALERTING_SECRET_MAX characters, no space or control character (a routing key or token is
    one word; a pasted file or a trailing newline would be sent as part of it)."""
    if not 0 < len(value) <= defaults.ALERTING_SECRET_MAX or any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"kilonode:{key}: must be 1 to {defaults.ALERTING_SECRET_MAX} printable characters "
                         "without spaces or newlines")
    return value


def read_secrets(alerting: AlertingPlan | None, config: pulumi.Config,
                 required: bool = True) -> dict[str, pulumi.Output[str]]:
    """The receivers' secrets from Pulumi secret config (`pulumi config set --secret kilonode:<key>`),
    each checked (checked_secret) when its value is known. A key the plan needs but the stack lacks is
    a RunError when `required` (`pulumi up`); under the mock engine (`kilonode plan`, the tests) a
    stand-in secret keeps the graph's shape."""
    found: dict[str, pulumi.Output[str]] = {}
    for file in needed_secrets(alerting):
        key = SECRET_KEYS[file]
        value = config.get_secret(key)
        if value is None:
            if required:
                raise pulumi.RunError(f"the stack's alerting needs the Pulumi secret kilonode:{key}: "
                                      f"`pulumi config set --secret kilonode:{key} <value>`")
            value = pulumi.Output.secret(f"unset-{key}")
        found[file] = value.apply(lambda v, key=key: checked_secret(key, v))
    return found


def alertmanager_args() -> list[str]:
    """The flags (cmd/alertmanager/main.go l.51-90 at v0.34.0)."""
    return [
        f"--config.file={CONFIG_DIR}/{CONFIG_FILE}",
        f"--storage.path={DATA_DIR}",
        # the default, named: silences and notification-log entries kept 5 days past their end
        f"--data.retention={defaults.ALERTMANAGER_RETENTION}",
        # HA mode off: one replica, no gossip listener on 9094 (the flag's help: "Set to empty string
        # to disable HA mode")
        "--cluster.listen-address=",
    ]


def alertmanager_pod(args: AlertmanagerArgs, config: core.v1.ConfigMap,
                     secret: core.v1.Secret | None) -> core.v1.PodSpecArgs:
    p = args.prometheus
    assert p is not None
    mounts = [core.v1.VolumeMountArgs(name="config", mount_path=CONFIG_DIR, read_only=True),
              core.v1.VolumeMountArgs(name=DATA_VOLUME, mount_path=DATA_DIR)]
    volumes = [core.v1.VolumeArgs(name="config", config_map=core.v1.ConfigMapVolumeSourceArgs(
        name=config.metadata.name))]
    if secret is not None:
        mounts.append(core.v1.VolumeMountArgs(name="receivers", mount_path=SECRETS_DIR, read_only=True))
        # group-readable by fsGroup 65534 only (the kubelet sets the files' group to fsGroup)
        volumes.append(core.v1.VolumeArgs(name="receivers", secret=core.v1.SecretVolumeSourceArgs(
            secret_name=secret.metadata.name, default_mode=0o440)))
    return core.v1.PodSpecArgs(
        automount_service_account_token=False,  # it calls no API of the cluster
        node_selector={POOL_LABEL: p.pool},
        tolerations=[_toleration(taint) for taint in p.pool_taints],
        # fsGroup: the claim's new disk writable by 65534 (the CSIDriver's fsGroupPolicy File, as Prometheus's)
        security_context=pod_security_context(run_as_non_root=True, run_as_user=ALERTMANAGER_UID,
                                               run_as_group=ALERTMANAGER_UID, fs_group=ALERTMANAGER_UID),
        containers=[core.v1.ContainerArgs(
            name=ALERTMANAGER,
            image=args.image,
            args=alertmanager_args(),
            ports=[core.v1.ContainerPortArgs(name="web", container_port=ALERTMANAGER_PORT, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(requests=defaults.ALERTMANAGER_REQUESTS,
                                                       limits=defaults.ALERTMANAGER_LIMITS),
            readiness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/-/ready", port="web"),
                                              period_seconds=10),
            liveness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/-/healthy", port="web"),
                                             period_seconds=15, timeout_seconds=10, failure_threshold=8),
            security_context=container_security_context(ALERTMANAGER_UID),
            volume_mounts=mounts,
        )],
        volumes=volumes,
    )


def data_claim() -> core.v1.PersistentVolumeClaimArgs:
    """Silences and the notification log: ALERTMANAGER_VOLUME_GIB on PREMIUM_RETAIN_CLASS, as
    Prometheus's claim (ReadWriteOnce: Azure Disk's only mode)."""
    return core.v1.PersistentVolumeClaimArgs(
        metadata=meta.v1.ObjectMetaArgs(name=DATA_VOLUME, labels=ALERTMANAGER_LABELS),
        spec=core.v1.PersistentVolumeClaimSpecArgs(
            access_modes=["ReadWriteOnce"],
            storage_class_name=PREMIUM_RETAIN_CLASS,
            resources=core.v1.VolumeResourceRequirementsArgs(
                requests={"storage": f"{defaults.ALERTMANAGER_VOLUME_GIB}Gi"}),
        ),
    )


def ingress_policy(name: str, namespace: pulumi.Input[str], labels: Mapping[str, str],
                   opts: pulumi.ResourceOptions) -> networking.v1.NetworkPolicy:
    """Port 9093 of Alertmanager's pods from Prometheus's (alerts, the scrape) and Grafana's pods
    alone; the namespace's default deny (kilonode.k8s.monitoring) shuts everything else."""
    peers = [networking.v1.NetworkPolicyPeerArgs(pod_selector=meta.v1.LabelSelectorArgs(match_labels=dict(s)))
             for s in (PROMETHEUS_LABELS, GRAFANA_LABELS)]
    return networking.v1.NetworkPolicy(
        name,
        metadata=meta.v1.ObjectMetaArgs(name=ALERTMANAGER, namespace=namespace, labels=dict(labels)),
        spec=networking.v1.NetworkPolicySpecArgs(
            pod_selector=meta.v1.LabelSelectorArgs(match_labels=ALERTMANAGER_LABELS),
            policy_types=["Ingress"],
            ingress=[networking.v1.NetworkPolicyIngressRuleArgs(
                from_=peers, ports=[networking.v1.NetworkPolicyPortArgs(protocol="TCP", port=ALERTMANAGER_PORT)])],
        ),
        opts=opts,
    )


class Alertmanager(pulumi.ComponentResource):
    def __init__(self, name: str, args: AlertmanagerArgs, namespace: core.v1.Namespace,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Alertmanager", name, None, opts)
        if args.prometheus is None or not args.image or args.awaits is None or CONFIG_FILE not in args.files:
            raise ValueError(f"Alertmanager: prometheus, image, awaits and {CONFIG_FILE} are required")
        missing = sorted(set(needed_secrets(args.alerting)) - set(args.secrets))
        if missing:
            raise ValueError(f"Alertmanager: the plan's receivers need the secrets {', '.join(missing)}")
        child = pulumi.ResourceOptions(parent=self)
        ns = namespace.metadata.name
        labels = {**LABELS, **ALERTMANAGER_LABELS}
        ingress_policy(f"{name}-ingress", ns, labels, child)
        config = core.v1.ConfigMap(f"{name}-config", metadata=meta.v1.ObjectMetaArgs(
            name=ALERTMANAGER, namespace=ns, labels=labels), data=dict(args.files), opts=child)
        secret = None
        if args.secrets:
            secret = core.v1.Secret(f"{name}-receivers", metadata=meta.v1.ObjectMetaArgs(
                name=RECEIVERS_SECRET, namespace=ns, labels=labels),
                string_data={k: pulumi.Output.secret(v) for k, v in sorted(args.secrets.items())}, opts=child)
        service = core.v1.Service(
            f"{name}-service", metadata=meta.v1.ObjectMetaArgs(name=ALERTMANAGER, namespace=ns, labels=labels),
            spec=core.v1.ServiceSpecArgs(selector=ALERTMANAGER_LABELS, ports=[core.v1.ServicePortArgs(
                name="web", port=ALERTMANAGER_PORT, target_port="web")]),
            opts=awaited(child, args.awaits))
        apps.v1.StatefulSet(
            f"{name}-statefulset",
            metadata=meta.v1.ObjectMetaArgs(name=ALERTMANAGER, namespace=ns, labels=labels),
            spec=apps.v1.StatefulSetSpecArgs(
                replicas=1,  # one: see the module's docstring
                service_name=service.metadata.name,
                selector=meta.v1.LabelSelectorArgs(match_labels=ALERTMANAGER_LABELS),
                template=core.v1.PodTemplateSpecArgs(
                    # it reads its configuration at start (and on SIGHUP): a change rolls the pod
                    metadata=meta.v1.ObjectMetaArgs(labels=labels,
                                                    annotations=config_digest_annotation(dict(args.files))),
                    spec=alertmanager_pod(args, config, secret)),
                volume_claim_templates=[data_claim()],
                # Kubernetes' defaults, named, as Prometheus's: the claim outlives the StatefulSet
                persistent_volume_claim_retention_policy=apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"),
            ),
            opts=awaited(child, args.awaits))
        self.register_outputs({})
