"""probe-anonymous: the load balancers' HTTP(S) probes of the apiservers are answered 200 without credentials.

The apiserver load balancers (kilonode.azure.control_plane) probe each apiserver over HTTPS on its secure
port (kilonode.plan.defaults.network LB_PROBE_PATH: /readyz, so that --shutdown-delay-duration takes a
terminating apiserver out first). Azure sends the probe without credentials and counts it up only on
"200 OK" (Azure/azure-rest-api-specs specification/network network loadBalancer.json ProbePropertiesFormat
`protocol`: "If 'Http' or 'Https' is specified, a 200 OK response from the specifies URI is required for the
probe to be successful"); a probe down takes the apiserver out of the backend pool for new flows.

So each apiserver must let an anonymous request of the probe's path through, at both stages:
- authentication: kube-apiserver's --anonymous-auth defaults to true (k8s.io/apiserver pkg/server/options
  authentication.go BuiltInAuthenticationOptions.WithAnonymous); with --authentication-config, the file's
  `anonymous` block decides (AuthenticationConfiguration apiserver.config.k8s.io/v1: `enabled`, and with
  `conditions` only the listed paths are anonymous; k8s.io/apiserver pkg/apis/apiserver/types.go
  AnonymousAuthConfig, AnonymousAuthCondition). Off, or the path not among the conditions: 401.
- authorization: RBAC lets system:unauthenticated GET only the bootstrap ClusterRole
  system:public-info-viewer's non-resource URLs, "/healthz", "/livez", "/readyz", "/version", "/version/"
  (kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go ClusterRoles; bound to
  system:authenticated and system:unauthenticated, catalog/rbac.yaml). Another path: 403.

A break here is not seen at `pulumi up`: the VMs roll one at a time (each new apiserver fails its probe and
leaves the pool), and when the last one has rolled no new connection through either load balancer reaches
an apiserver: kubelets, controllers, the deployer. The render allows anonymous on the health paths only
(kilonode.render.control_plane ANONYMOUS_PATHS, CIS 1.2.1 otherwise kept); this check judges whatever the
rendered units and files say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.plan import wellknown
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import flags_of, unit_exec_args
from kilonode.yamlio import load_yaml

NAME = "probe-anonymous"
TITLE = "the apiserver load balancers' probes are answered 200 without credentials"

LOAD_BALANCER = "azure-native:network:LoadBalancer"
UNIT = "etc/systemd/system/kube-apiserver.service"
# system:public-info-viewer's nonResourceURLs (bootstrappolicy/policy.go): what an anonymous request may GET
PUBLIC_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version", "/version/"})
_FALSE = {"false", "0", "f", "False", "FALSE"}  # Go strconv.ParseBool's false words


def _probes(inputs: Inputs, port: int) -> list[tuple[str, str]]:
    """(load balancer, path) of each HTTP(S) probe on the apiservers' secure port."""
    found = []
    for lb in inputs.of_type(LOAD_BALANCER):
        for probe in lb.inputs.get("probes") or []:
            if str(probe.get("protocol", "")).lower() in ("http", "https") and probe.get("port") == port:
                found.append((lb.name, str(probe.get("requestPath") or "/")))
    return found


def _anonymous(flags: Mapping[str, str], files: Mapping[str, str]) -> tuple[bool, frozenset[str] | None, str]:
    """(anonymous allowed at all, the paths it is limited to or None for every path, whose word)."""
    config_path = flags.get("authentication-config")
    if config_path:
        text = files.get(config_path.lstrip("/"))
        document: Any = load_yaml(text) if text else None
        block = (document or {}).get("anonymous") if isinstance(document, Mapping) else None
        if isinstance(block, Mapping):
            if block.get("enabled") is not True:
                return False, None, f"{config_path}: anonymous.enabled is {block.get('enabled')}"
            conditions = block.get("conditions") or []
            paths = frozenset(str(c.get("path")) for c in conditions if isinstance(c, Mapping))
            return True, (paths or None), f"{config_path}: anonymous enabled" + (
                f" on {', '.join(sorted(paths))} only" if paths else "")
    value = flags.get("anonymous-auth", "true")
    return value not in _FALSE, None, f"--anonymous-auth={value}" if "anonymous-auth" in flags else \
        "--anonymous-auth unset (default true)"


def check(inputs: Inputs) -> list[Finding]:
    port = wellknown.APISERVER_PORT
    probes = _probes(inputs, port)
    if not probes:
        return []
    findings = []
    refused: dict[tuple[str, str], list[str]] = {}
    for host in inputs.hosts():
        files = inputs.host_files(host)
        unit = files.get(UNIT)
        if not host.startswith("apiserver") or unit is None:
            continue
        try:
            flags = flags_of(unit_exec_args(unit))
        except ValueError:
            continue  # a unit that does not split: component-flags and the unit checks say so
        allowed, paths, why = _anonymous(flags, files)
        for path in sorted({p for _, p in probes}):
            if not allowed:
                refused.setdefault((path, f"401: anonymous authentication is off ({why})"), []).append(host)
            elif paths is not None and path not in paths:
                refused.setdefault((path, f"401: anonymous requests are allowed only on other paths ({why})"),
                                   []).append(host)
            elif path not in PUBLIC_PATHS:
                refused.setdefault((path, "403: RBAC lets system:unauthenticated read only "
                                          f"{', '.join(sorted(PUBLIC_PATHS))} (system:public-info-viewer)"),
                                   []).append(host)
    for (path, answer), hosts in sorted(refused.items()):
        lbs = sorted({lb for lb, p in probes if p == path})
        findings.append(Finding(
            NAME, "break", ", ".join(hosts),
            f"the load balancers {', '.join(lbs)} probe https://<apiserver>:{port}{path} without credentials and "
            f"count only 200 as up; these apiservers answer {answer}. Each one rolled onto this configuration leaves "
            "both load balancers' pools; once all have, no new connection through them reaches an apiserver "
            "(kubelets, controllers, the deployer), though every apiserver runs",
            f"allow anonymous requests of {path} (AuthenticationConfiguration anonymous: enabled true with a "
            f"condition for {path}: kilonode.render.control_plane ANONYMOUS_PATHS), keep --anonymous-auth unset, or "
            "probe a path and protocol that need no credentials"))
    return findings
