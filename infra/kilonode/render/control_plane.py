"""Control-plane node artefacts: kube-apiserver, kube-scheduler, kube-controller-manager."""

from __future__ import annotations

from typing import Any

from kilonode.node.ship import GPU_HEALTH, NODE_CLIENT_APPROVER, PYTHON
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ApiserverInstance, ClusterPlan, ControllerClientsPlan
from kilonode.render.cert_metrics import UNITS_TO_ENABLE as CERT_METRICS_UNITS
from kilonode.render.cert_metrics import cert_metrics_files
from kilonode.render.cloud_init import user_data
from kilonode.render.common import GENERATED, Flag, InCredentials, render_template, systemd_exec
from kilonode.render.files import USER_DATA, HostFiles, RenderedFile
from kilonode.render.gpu_metrics import (
    CONTROLLER_RECORD,
    CONTROLLER_RUNTIME_DIRECTORY,
    CONTROLLER_UNITS,
    controller_metrics_files,
)
from kilonode.yamlio import block_yaml

BIN = "/usr/local/bin"
UNIT_TEMPLATE = "etc/systemd/system/kube-control-plane.service"
AUDIT_POLICY = "etc/kubernetes/audit-policy.yaml"
AUTHENTICATION_CONFIG = "etc/kubernetes/authentication-config.yaml"
ADMISSION_CONFIG = "etc/kubernetes/admission-config.yaml"
# The only paths an unauthenticated client may read: what the load balancer probes.
ANONYMOUS_PATHS = ("/healthz", "/livez", "/readyz")
SCHEDULER_CONFIG = "etc/kubernetes/kube-scheduler-config.yaml"
GPU_HEALTH_CONTROLLER = "kilonode-gpu-health-controller.service"
# Units that carry a component's command line, root's alone (CIS 1.1.1-1.1.6: 600 or stricter;
# systemd reads them as root).
UNIT_MODE = 0o600
GPU_HEALTH_CONTROLLER_UNIT = f"etc/systemd/system/{GPU_HEALTH_CONTROLLER}"
NODE_CLIENT_APPROVER_SERVICE = "kilonode-node-client-approver.service"
NODE_CLIENT_APPROVER_UNIT = f"etc/systemd/system/{NODE_CLIENT_APPROVER_SERVICE}"


def apiserver_flags(plan: ClusterPlan, instance: ApiserverInstance) -> list[Flag]:
    cp = plan.control_plane
    audit = cp.audit_log
    reads = plan.components.apiserver_max_requests_inflight
    mutating = plan.components.apiserver_max_mutating_requests_inflight
    flags: list[Flag] = [
        ("advertise-address", str(instance.ip)),
        ("secure-port", 6443),
        ("etcd-servers", cp.etcd_servers),
        # 7,500-node post: Events in their own etcd cluster.
        ("etcd-servers-overrides", cp.etcd_servers_overrides),
        ("etcd-cafile", wellknown.APISERVER_ETCD_CA_BUNDLE),
        ("etcd-certfile", wellknown.APISERVER_ETCD_CLIENT_CERT),
        ("etcd-keyfile", wellknown.APISERVER_ETCD_CLIENT_KEY),
        # CIS 1.2.1: no anonymous requests -- except on the health endpoints, which the
        # Azure load balancer's HTTPS /readyz probe reads without credentials; a plain
        # --anonymous-auth=false would fail every probe with 401 and take all apiservers
        # out of the load balancer. The file allows anonymous on ANONYMOUS_PATHS only.
        ("authentication-config", f"/{AUTHENTICATION_CONFIG}"),
        # TLS bootstrap, as kubeadm: a node's kubelet authenticates with a bootstrap token
        # (a kube-system Secret of type bootstrap.kubernetes.io/token) until it has its
        # client certificate. Independent of --authentication-config (JWT and anonymous only).
        ("enable-bootstrap-token-auth", True),
        # CIS 1.2.7-1.2.9: Node and RBAC authorization.
        ("authorization-mode", "Node,RBAC"),
        # CIS 1.2.3: no Service claims an external IP (CVE-2020-8554); kilonode's use none.
        ("enable-admission-plugins", "NodeRestriction,DenyServiceExternalIPs"),
        # PodSecurity (on by default since 1.25) enforces the cluster's default levels from
        # this file (admission_config); namespaces carry their own labels (kilonode.k8s.pod_security).
        ("admission-control-config-file", f"/{ADMISSION_CONFIG}"),
        # Secrets encrypted in etcd (kilonode.plan.encryption: which provider and why). The
        # file holds the key: the Pulumi program delivers it, 0600, to the apiservers only. No
        # --encryption-provider-config-automatic-reload: the file changes only with a VM's
        # custom data, which a VM reads at its first boot.
        ("encryption-provider-config", wellknown.ENCRYPTION_CONFIG),
        # Field notes: --apiserver-count, today the lease endpoint reconciler.
        ("endpoint-reconciler-type", "lease"),
        # 2,500-node post: audit logs found the slow and excessive queries (CIS 1.2.16-19).
        # On the local SSD, the files as many as half that disk holds (kilonode.plan.resolve.disks).
        ("audit-log-path", audit.path),
        ("audit-log-maxage", audit.max_age_days),
        ("audit-log-maxbackup", audit.max_backup),
        ("audit-log-maxsize", audit.max_size_mb),
        ("audit-policy-file", f"/{AUDIT_POLICY}"),
        ("client-ca-file", wellknown.K8S_CA),
        ("tls-cert-file", wellknown.APISERVER_CERT),
        ("tls-private-key-file", wellknown.APISERVER_KEY),
        ("tls-cipher-suites", ",".join(defaults.TLS_CIPHER_SUITES)),  # AEAD only (CIS 1.2.29)
        *_kubelet_client(),
        *_aggregation_layer(),
        ("service-account-issuer", "https://kubernetes.default.svc.cluster.local"),
        ("service-account-key-file", wellknown.SERVICE_ACCOUNT_PUB),
        ("service-account-signing-key-file", wellknown.SERVICE_ACCOUNT_KEY),
        ("service-cluster-ip-range", str(cp.service_cidr)),
        ("profiling", False),
        # GPU device plugins and DCGM run privileged.
        ("allow-privileged", True),
        # Field notes: per-node agents and monitoring fleets overloaded the apiservers; alert on
        # 429s. API Priority and Fairness (the default; named because the two limits below mean
        # something else without it) queues by priority level (kilonode.k8s.flowcontrol).
        ("enable-priority-and-fairness", True),
        # With APF the two are summed into the server's total concurrency limit, which APF
        # divides among its levels (server_run_options.go l.350-360 and feature.go l.77-85 at
        # kubernetes/apiserver kubernetes-1.34.2); sized by the plan (components).
        ("max-requests-inflight", reads),
        ("max-mutating-requests-inflight", mutating),
        # Not set: --watch-cache-sizes ("all non-zero values are equivalent", etcd.go l.158-165:
        # watch caches size themselves) and the deprecated --default-watch-cache-size (l.152-156).
    ]
    flags += _emulated_version(plan)
    if len(cp.instances) > 1:
        flags += [
            # Several apiservers behind the Azure load balancer: HTTP/2 clients that stick to
            # one would never come back to a restarted apiserver (defaults: upstream's
            # recommended starting point, never with a single apiserver).
            ("goaway-chance", defaults.APISERVER_GOAWAY_CHANCE),
            # Keep serving while the load balancer's probe takes this one out.
            ("shutdown-delay-duration", f"{defaults.APISERVER_SHUTDOWN_DELAY_S}s"),
        ]
    return flags


def _emulated_version(plan: ClusterPlan) -> list[Flag]:
    """--emulated-version, only while the stack sets controlPlaneEmulatedVersion (a minor upgrade's
    binaries-first step, `kilonode upgrade`): the component serves the APIs, feature defaults and
    storage versions of that minor, so its binary can be rolled back to it. All three control-plane
    programs register it: kube-apiserver through ServerRunOptions.AddUniversalFlags
    (k8s.io/apiserver pkg/server/options/server_run_options.go at kubernetes-1.35.4, l.401:
    ComponentGlobalsRegistry.AddFlags), kube-controller-manager and kube-scheduler through the same
    registry (their command-line references at 1.35 list it: "Options are: kube=1.32..1.35"). No
    feature gate guards it (k8s.io/component-base compatibility/registry.go at kubernetes-1.35.4,
    Set: the emulation version is applied before any gate). The value is major.minor ("patch version
    not allowed", toVersionMap). Unset: no flag, the binary's own version, as before."""
    emulated = plan.control_plane_emulated_version
    return [] if emulated is None else [("emulated-version", emulated)]


def _kubelet_client() -> list[Flag]:
    """How the apiserver reaches the kubelets (logs, exec, port-forward): its own client
    certificate, the cluster CA for theirs."""
    return [
        ("kubelet-client-certificate", wellknown.APISERVER_KUBELET_CLIENT_CERT),
        ("kubelet-client-key", wellknown.APISERVER_KUBELET_CLIENT_KEY),
        ("kubelet-certificate-authority", wellknown.K8S_CA),
        # logs, exec, port-forward and metrics reach each kubelet at its VNet address: the default
        # order tries the node's hostname first, which would make them depend on Azure DNS
        # resolving 7,500 scale-set names; the kubelets' serving certificates carry the IP (the
        # CSR approver admits IP SANs in the pool subnets, kilonode.k8s.approver)
        ("kubelet-preferred-address-types", "InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP"),
    ]


# The request headers the apiserver names the user in when it proxies to an aggregated API server:
# the names upstream suggests and warns about (k8s.io/apiserver pkg/server/options/authentication.go
# at kubernetes-1.34.2, RequestHeaderAuthenticationOptions.Validate: "--requestheader-username-headers
# is set without specifying the standard X-Remote-User header - API aggregation will not work"; the
# same for X-Remote-Group and X-Remote-Extra-). --requestheader-uid-headers is left out: it needs the
# RemoteRequestHeaderUID feature gate (Validate), and metrics-server authorises by user and groups.
REQUEST_HEADERS = (
    ("requestheader-username-headers", "X-Remote-User"),
    ("requestheader-group-headers", "X-Remote-Group"),
    ("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
)


def _aggregation_layer() -> list[Flag]:
    """The aggregation layer, without which `kubectl top`, HPAs and every APIService fail
    (metrics-server: kilonode.k8s.metrics_server). The apiserver proxies a request for an
    aggregated API with its front-proxy client certificate, the user in REQUEST_HEADERS; it
    publishes the CA, the allowed name and the headers in kube-system/extension-apiserver-
    authentication, where the aggregated server reads them (kubernetes/website
    content/en/docs/tasks/extend-kubernetes/configure-aggregation-layer.md, "Enable Kubernetes
    Apiserver flags"). The front-proxy CA is not the cluster CA (kilonode.plan.pki FRONT_PROXY_CA)."""
    return [
        ("requestheader-client-ca-file", wellknown.FRONT_PROXY_CA),
        ("requestheader-allowed-names", defaults.FRONT_PROXY_CLIENT_USER),
        *REQUEST_HEADERS,
        ("proxy-client-cert-file", wellknown.FRONT_PROXY_CLIENT_CERT),
        ("proxy-client-key-file", wellknown.FRONT_PROXY_CLIENT_KEY),
        # The apiserver VMs run no kube-proxy (nor a kubelet): nothing there routes a Service's
        # ClusterIP, so the aggregator must dial an endpoint of the APIService's Service (a pod IP
        # in a pool subnet, which the pools' NSG admits from the control-plane subnet:
        # kilonode.azure.network) instead ("If you are not running kube-proxy on a host running the
        # API server, then you must make sure that the system is enabled with ...
        # --enable-aggregator-routing=true", the page above). It also spreads the requests over
        # metrics-server's replicas (its README, "High Availability").
        ("enable-aggregator-routing", True),
    ]


def _metrics_serving(instance: ApiserverInstance, port: int, cert: str, key: str) -> list[Flag]:
    """The secure port of kube-scheduler or kube-controller-manager, where the cluster's Prometheus
    scrapes /metrics (kilonode.render.monitoring): on the host's own address, not 0.0.0.0 (no other
    interface, loopback included, answers), with a certificate the cluster CA issued for that
    address (kilonode.plan.pki), so Prometheus verifies it with the CA its ServiceAccount mounts.
    Without --tls-cert-file the program signs its own certificate for localhost/127.0.0.1
    (SecureServingOptions.MaybeDefaultWithSelfSignedCerts), which no client can verify. /metrics
    is authorised by the apiserver (SubjectAccessReview through --authorization-kubeconfig): the
    Prometheus ServiceAccount has `get` on it (kilonode.k8s.monitoring). CIS 1.3.7 and 1.4.2 want
    127.0.0.1: the exception and its reasons are in policy/security-exceptions.yaml."""
    return [
        ("bind-address", str(instance.ip)),
        ("secure-port", port),
        ("tls-cert-file", cert),
        ("tls-private-key-file", key),
        ("tls-cipher-suites", ",".join(defaults.TLS_CIPHER_SUITES)),  # AEAD only, as the apiserver's
    ]


def scheduler_flags(instance: ApiserverInstance, emulated: list[Flag] | None = None) -> list[Flag]:
    # With --config, kube-scheduler honours only the serving, delegated authn/authz and
    # leader-elect* flags; --profiling and the other deprecated flags are ignored
    # (cmd/kube-scheduler/app/options/options.go ApplyTo, deprecated.go), so profiling is
    # turned off in the file (enableProfiling, scheduler_config).
    return [
        ("config", f"/{SCHEDULER_CONFIG}"),
        ("authentication-kubeconfig", wellknown.SCHEDULER_KUBECONFIG),
        ("authorization-kubeconfig", wellknown.SCHEDULER_KUBECONFIG),
        *_metrics_serving(instance, wellknown.SCHEDULER_PORT, wellknown.SCHEDULER_SERVING_CERT,
                          wellknown.SCHEDULER_SERVING_KEY),
        # honoured with --config: Options.ApplyTo sets the version registry (SetFallback) before it
        # reads the file (cmd/kube-scheduler/app/options/options.go; flag in the "feature gate" set)
        *(emulated or []),
    ]


def controller_manager_flags(instance: ApiserverInstance, emulated: list[Flag] | None = None,
                             clients: ControllerClientsPlan | None = None) -> list[Flag]:
    # Each controller's client rate, sized for the joins (kilonode.plan.resolve.clients: at upstream's 20 the
    # DaemonSet controller creates research-7500's DaemonSet pods in 44 min where the joins end in 24); written
    # where it is upstream's default too, so the unit says it.
    qps: list[Flag] = [] if clients is None else [
        ("kube-api-qps", clients.controller_manager_qps), ("kube-api-burst", clients.controller_manager_burst)]
    return [
        ("kubeconfig", wellknown.CONTROLLER_MANAGER_KUBECONFIG),
        ("authentication-kubeconfig", wellknown.CONTROLLER_MANAGER_KUBECONFIG),
        ("authorization-kubeconfig", wellknown.CONTROLLER_MANAGER_KUBECONFIG),
        *_metrics_serving(instance, wellknown.CONTROLLER_MANAGER_PORT, wellknown.CONTROLLER_MANAGER_SERVING_CERT,
                          wellknown.CONTROLLER_MANAGER_SERVING_KEY),
        # No --cluster-name: since 1.31 (KEP-2395) kube-controller-manager runs no cloud
        # controller, and nothing else reads it (cmd/kube-controller-manager/app/core.go).
        ("leader-elect", True),
        ("use-service-account-credentials", True),
        # TLS bootstrap: both are off by default (cmd/kube-controller-manager/names:
        # disabled-by-default controllers); the token cleaner deletes expired bootstrap tokens
        # (the pools' join tokens carry an `expiration`: kilonode.k8s.bootstrap), the bootstrap
        # signer signs cluster-info for token discovery, as kubeadm enables them. csrapproving
        # (in "*") still approves renewals (selfnodeclient); a first client certificate is the
        # node client approver's (no nodeclient binding).
        ("controllers", "*,bootstrap-signer-controller,token-cleaner-controller"),
        ("root-ca-file", wellknown.K8S_CA),
        ("cluster-signing-cert-file", wellknown.K8S_CA),
        ("cluster-signing-key-file", wellknown.K8S_CA_KEY),
        ("service-account-private-key-file", wellknown.SERVICE_ACCOUNT_KEY),
        # Native pod networking: pod IPs are Azure NIC addresses, not node CIDRs. With node
        # IPAM off, --service-cluster-ip-range and --cluster-cidr are ignored
        # (cmd/kube-controller-manager/app/options/nodeipamcontroller.go), so neither is set.
        ("allocate-node-cidrs", False),
        ("cloud-provider", "external"),
        ("profiling", False),
        *qps,
        *(emulated or []),
    ]


def scheduler_config(plan: ClusterPlan) -> str:
    resources: list[dict[str, Any]] = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
    if any(pool.gpus_per_node for pool in plan.node_pools):
        resources.append({"name": "nvidia.com/gpu", "weight": 1})
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # its client's rate, sized for the joins' DaemonSet pods it binds (kilonode.plan.resolve.clients)
        "clientConnection": {"kubeconfig": wellknown.SCHEDULER_KUBECONFIG,
                             "qps": plan.controller_clients.scheduler_qps,
                             "burst": plan.controller_clients.scheduler_burst},
        "leaderElection": {"leaderElect": True},
        # CIS 1.4.1: no profiling. The --profiling flag is ignored with --config.
        "enableProfiling": False,
        "profiles": [{
            "schedulerName": "default-scheduler",
            # 2,500-node post: pack nodes instead of spreading (MostRequestedPriority
            # weight 1 + InterPodAffinityPriority weight 2), so empty nodes can scale down
            # and whole-node pods schedule at once.
            "plugins": {
                "score": {
                    "disabled": [{"name": "NodeResourcesBalancedAllocation"}],
                    "enabled": [
                        {"name": "NodeResourcesFit", "weight": 1},
                        {"name": "InterPodAffinity", "weight": 2},
                    ],
                },
            },
            "pluginConfig": [{
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": "MostAllocated", "resources": resources}},
            }],
        }],
    }
    return f"# {GENERATED}\n" + block_yaml(config)


def authentication_config(plan: ClusterPlan) -> str:
    # AuthenticationConfiguration is v1 from 1.34 (structured authentication GA).
    version = "v1" if plan.kubernetes_minor >= 34 else "v1beta1"
    config = {
        "apiVersion": f"apiserver.config.k8s.io/{version}",
        "kind": "AuthenticationConfiguration",
        "anonymous": {"enabled": True, "conditions": [{"path": path} for path in ANONYMOUS_PATHS]},
    }
    return f"# {GENERATED}\n" + block_yaml(config)


def admission_config(plan: ClusterPlan) -> str:
    """The PodSecurity plugin's defaults for namespaces without labels (plan.defaults.pod_security).
    AdmissionConfiguration: apiserver.config.k8s.io/v1 (staging/src/k8s.io/apiserver/pkg/apis/
    apiserver/v1/types.go: plugins[].name, .configuration); PodSecurityConfiguration:
    pod-security.admission.config.k8s.io/v1, GA since 1.25 (staging/src/k8s.io/pod-security-
    admission/admission/api/v1/types.go: defaults.{enforce,audit,warn}[-version], exemptions)."""
    version = f"v1.{plan.kubernetes_minor}"
    pod_security = {
        "apiVersion": "pod-security.admission.config.k8s.io/v1",
        "kind": "PodSecurityConfiguration",
        "defaults": {
            "enforce": defaults.POD_SECURITY_DEFAULT_ENFORCE, "enforce-version": version,
            "audit": defaults.POD_SECURITY_DEFAULT_AUDIT, "audit-version": version,
            "warn": defaults.POD_SECURITY_DEFAULT_WARN, "warn-version": version,
        },
        # No exemptions: kube-system's node agents are admitted by its own `privileged` label.
        "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": "PodSecurity", "configuration": pod_security}],
    }
    return f"# {GENERATED}\n" + block_yaml(config)


def audit_policy() -> str:
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            # Events live in their own etcd and come in storms; auditing them adds load
            # and no insight.
            {"level": "None", "resources": [{"group": "", "resources": ["events"]}]},
            # 2,500-node post: who asks what, how often, how slowly - metadata is enough.
            {"level": "Metadata"},
        ],
    }
    return f"# {GENERATED}\n" + block_yaml(policy)


# What the apiserver-VM agents that parse node-controlled input (bootstrap CSRs, Node objects)
# must never read, should a parser bug give an attacker their process: the cluster CA's and the
# service-account signing keys and the apiserver's etcd client key (all in the PKI directory)
# and the key that encrypts Secrets in etcd. They run as a dynamic user, so these root 0600 files
# are unreadable already; InaccessiblePaths= hides them from the process's view as well.
# Each with "-": a path missing on some host is no reason to refuse the unit. (systemd.exec(5)
# DynamicUser=, LoadCredential=, InaccessiblePaths=: all in systemd 252, Debian 12's.) The
# units' own comments stay short: every byte is in each apiserver's custom data.
AGENT_INACCESSIBLE = (wellknown.K8S_PKI_DIR, wellknown.ENCRYPTION_CONFIG)
# The ID each agent's kubeconfig is loaded under (LoadCredential=): its flag reads %d/<this>.
KUBECONFIG_CREDENTIAL = "kubeconfig"


def gpu_health_controller_unit() -> RenderedFile:
    """The taint controller (kilonode.gpu.controller on the machine), from the package the
    control-plane image carries (kilonode.node.ship), with its own kubeconfig (kilonode.azure.tls
    delivers it)."""
    return RenderedFile(render_template(
        GPU_HEALTH_CONTROLLER_UNIT,
        python_path=GPU_HEALTH.pythonpath,
        exec_start=systemd_exec(f"{PYTHON} -m {GPU_HEALTH.module}.controller",
                                [("kubeconfig", InCredentials(KUBECONFIG_CREDENTIAL)),
                                 ("metrics-file", CONTROLLER_RECORD)]),
        runtime_directory=CONTROLLER_RUNTIME_DIRECTORY,
        credential=f"{KUBECONFIG_CREDENTIAL}:{wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG}",
        inaccessible=" ".join(f"-{path}" for path in AGENT_INACCESSIBLE),
    ))


def node_client_approver_unit() -> RenderedFile:
    """The node client approver (kilonode.node.node_client_approver on the machine), from the
    package the control-plane image carries (kilonode.node.ship), with its own kubeconfig
    (kilonode.azure.tls delivers it). Its pool table is a ConfigMap (kilonode.k8s.bootstrap), not a
    file here: a pool's new scale set must not change every apiserver's custom data."""
    return RenderedFile(render_template(
        NODE_CLIENT_APPROVER_UNIT,
        python_path=NODE_CLIENT_APPROVER.pythonpath,
        exec_start=systemd_exec(f"{PYTHON} -m {NODE_CLIENT_APPROVER.module}.main",
                                [("kubeconfig", InCredentials(KUBECONFIG_CREDENTIAL))]),
        credential=f"{KUBECONFIG_CREDENTIAL}:{wellknown.NODE_CLIENT_APPROVER_KUBECONFIG}",
        inaccessible=" ".join(f"-{path}" for path in AGENT_INACCESSIBLE),
    ))


def _unit(component: str, description: str, flags: list[Flag], mount_point: str | None = None) -> RenderedFile:
    """`mount_point`: the local-SSD mount the component writes to, required by the unit."""
    binary = f"{BIN}/{component}"
    return RenderedFile(render_template(
        UNIT_TEMPLATE,
        component=component,
        description=description,
        binary=binary,
        exec_start=systemd_exec(binary, flags),
        mount_point=mount_point,
    ), mode=UNIT_MODE)


def audit_mount(plan: ClusterPlan) -> str | None:
    """The apiserver's local-SSD mount point when the audit log is below it (the plan's
    default), else None: a path the stack put elsewhere is its own choice."""
    mount = plan.control_plane.local_disk.mount_point.rstrip("/")
    return mount if plan.control_plane.audit_log.path.startswith(mount + "/") else None


def render_apiserver(plan: ClusterPlan, instance: ApiserverInstance) -> HostFiles:
    files: HostFiles = {
        "etc/systemd/system/kube-apiserver.service": _unit(
            "kube-apiserver", f"Kubernetes API server {instance.name}", apiserver_flags(plan, instance),
            audit_mount(plan),
        ),
        "etc/systemd/system/kube-scheduler.service": _unit(
            "kube-scheduler", "Kubernetes scheduler (leader-elected)",
            scheduler_flags(instance, _emulated_version(plan)),
        ),
        "etc/systemd/system/kube-controller-manager.service": _unit(
            "kube-controller-manager", "Kubernetes controller manager (leader-elected)",
            controller_manager_flags(instance, _emulated_version(plan), plan.controller_clients),
        ),
        AUDIT_POLICY: RenderedFile(audit_policy()),
        ADMISSION_CONFIG: RenderedFile(admission_config(plan)),
        AUTHENTICATION_CONFIG: RenderedFile(authentication_config(plan)),
        SCHEDULER_CONFIG: RenderedFile(scheduler_config(plan)),
        # a joining kubelet's first client certificate: kube-controller-manager approves none
        # (kilonode.k8s.bootstrap binds no nodeclient), this does, per pool
        NODE_CLIENT_APPROVER_UNIT: node_client_approver_unit(),
    }
    # its certificates' expiry, for the alert (kilonode.render.cert_metrics)
    files |= cert_metrics_files(plan, instance.name, str(instance.ip))
    start_units = ["kube-apiserver.service", "kube-scheduler.service", "kube-controller-manager.service",
                   NODE_CLIENT_APPROVER_SERVICE, *CERT_METRICS_UNITS]
    # GPU nodes register with a startup taint only this controller lifts: it runs wherever
    # there are GPU pools, and only there.
    if plan.gpu_pools:
        files[GPU_HEALTH_CONTROLLER_UNIT] = gpu_health_controller_unit()
        start_units.append(GPU_HEALTH_CONTROLLER)
        # what the controller has been doing, for Prometheus
        files |= controller_metrics_files(instance.name, str(instance.ip))
        start_units += CONTROLLER_UNITS
    files[USER_DATA] = RenderedFile(user_data(
        role=f"apiserver {instance.name} of cluster {plan.cluster}",
        local_disk=plan.control_plane.local_disk,
        local_disk_alias=plan.control_plane.disks.local_disk_alias,
        files=files,
        restart_units=[],
        start_units=start_units,
    ))
    return dict(sorted(files.items()))
