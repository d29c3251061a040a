"""The expiry of a control-plane host's certificates, exposed for Prometheus: a socket unit on
the host's own address (wellknown.CERT_METRICS_PORT), the per-connection service it starts, and
the config of the program that answers (kilonode/node/cert_expiry.py, which the etcd and
control-plane images carry: kilonode.node.ship CERT_EXPIRY): the host's certificate files, read
from the PKI layout (every file that holds a certificate: its own leaves and the CAs it trusts).
Pure: plan in, files out.

Why a program of our own: etcd 3.5 exports no certificate expiry (etcd-io/etcd#21622), and
kube-apiserver's apiserver_client_certificate_expiration_seconds is a histogram of the
certificates clients present to it, not of its own files. Why socket activation: each scrape
reads the files as they are then, and nothing runs between scrapes (no daemon, no timer, no
file that can go stale); systemd bounds the connections.
"""

from __future__ import annotations

from kilonode.node.ship import CERT_EXPIRY, PYTHON
from kilonode.plan import pki, wellknown
from kilonode.plan.model import ClusterPlan
from kilonode.render.common import render_template, to_json
from kilonode.render.files import HostFiles, RenderedFile

SOCKET = "kilonode-cert-metrics.socket"
SERVICE = "kilonode-cert-metrics@.service"
SOCKET_PATH = f"etc/systemd/system/{SOCKET}"
SERVICE_PATH = f"etc/systemd/system/{SERVICE}"
SCRIPT_PATH = CERT_EXPIRY.machine_path.lstrip("/")  # in the etcd and control-plane images, not rendered
CONFIG_PATH = "etc/kilonode/certificates.json"
# What the host's cloud-init enables and starts: the socket; the service runs per connection.
UNITS_TO_ENABLE = (SOCKET,)
# Prometheus scrapes each host every 30 s; a handful at once is already a misbehaving client.
MAX_CONNECTIONS = 8
# One answer reads a dozen small files: a second is plenty, and a stuck one must not pile up.
RUNTIME_MAX_S = 10


# Where the answer finds the co-located components' client certificates, copied out of their
# kubeconfigs (0600, with the keys) by the unit's privileged ExecStartPre (kilonode/node/cert_expiry.py).
CLIENT_CERT_DIR = "/run/kilonode/client-certificates"


def _kubeconfigs(layout: pki.PkiLayout, host: str) -> list[str]:
    """The host's kubeconfigs that embed a client certificate."""
    return sorted(f.path for f in layout.hosts[host] if isinstance(f.content, pki.Kubeconfig) and f.content.client)


def certificate_files(layout: pki.PkiLayout, host: str) -> list[str]:
    """The host paths of the files that hold certificates: its leaves, the CAs and bundles, and the
    kubeconfigs that embed a client certificate (the co-located components'; read from their copies
    in CLIENT_CERT_DIR)."""
    return sorted([f.path for f in layout.hosts[host] if isinstance(f.content, pki.Cert | pki.Bundle)]
                  + _kubeconfigs(layout, host))


def cert_metrics_files(plan: ClusterPlan, host: str, address: str) -> HostFiles:
    """Socket, service and config for `host`, listening on `address` (the program is the image's)."""
    layout = pki.pki_layout(plan)
    return {
        SOCKET_PATH: RenderedFile(render_template(
            SOCKET_PATH, host=host, address=address, port=wellknown.CERT_METRICS_PORT,
            max_connections=MAX_CONNECTIONS,
        )),
        SERVICE_PATH: RenderedFile(render_template(
            SERVICE_PATH, host=host, exec_start=f"{PYTHON} /{SCRIPT_PATH} --config /{CONFIG_PATH}",
            extract=(f"{PYTHON} /{SCRIPT_PATH} --extract-client-certs --config /{CONFIG_PATH}"
                     if _kubeconfigs(layout, host) else None),
            runtime_max_s=RUNTIME_MAX_S,
        )),
        CONFIG_PATH: RenderedFile(to_json({"host": host, "files": certificate_files(layout, host),
                                           **({"copies": CLIENT_CERT_DIR} if _kubeconfigs(layout, host) else {})})),
    }
