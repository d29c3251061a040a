"""The GPU health agent's and taint controller's metrics endpoints: on each GPU node and each
apiserver VM of a cluster with GPU pools, a socket unit (Accept=yes) and the per-connection
service that answers one scrape with kilonode.gpu.metrics, which reads the record the agent or
the controller keeps in its runtime directory. Pure: plan in, files out.

Why socket activation, as kilonode.render.pod_traffic and cert_metrics: nothing runs between
scrapes, each answer reads the record as it is then, and systemd bounds the connections. The
program is the package the images carry (kilonode.node.ship GPU_HEALTH), beside the agent and
the controller that write the records it reads, so writer and reader change together; only
these units travel in the custom data.
"""

from __future__ import annotations

from kilonode.node.gpu import metrics as program
from kilonode.node.ship import GPU_HEALTH, PYTHON
from kilonode.plan import wellknown
from kilonode.render import node_ports
from kilonode.render.common import render_template
from kilonode.render.files import HostFiles, RenderedFile

AGENT_SOCKET = "kilonode-gpu-health-metrics.socket"
AGENT_SERVICE = "kilonode-gpu-health-metrics@.service"
CONTROLLER_SOCKET = "kilonode-gpu-health-controller-metrics.socket"
CONTROLLER_SERVICE = "kilonode-gpu-health-controller-metrics@.service"
AGENT_SOCKET_PATH = f"etc/systemd/system/{AGENT_SOCKET}"
AGENT_SERVICE_PATH = f"etc/systemd/system/{AGENT_SERVICE}"
CONTROLLER_SOCKET_PATH = f"etc/systemd/system/{CONTROLLER_SOCKET}"
CONTROLLER_SERVICE_PATH = f"etc/systemd/system/{CONTROLLER_SERVICE}"
# What the host's cloud-init enables and starts: the socket; the service runs per connection.
AGENT_UNITS = (AGENT_SOCKET,)
CONTROLLER_UNITS = (CONTROLLER_SOCKET,)
# The records the agent and the controller write (kilonode.gpu.metrics): the agent's in its
# default stateDir (the rendered gpu-health.json sets none), the controller's where its unit's
# --metrics-file puts it, inside its RuntimeDirectory.
AGENT_RECORD = program.AGENT_RECORD
CONTROLLER_RECORD = program.CONTROLLER_RECORD
CONTROLLER_RUNTIME_DIRECTORY = program.CONTROLLER_STATE_DIR.removeprefix("/run/")
# Prometheus scrapes each target every 15 to 60 s; a handful at once is already a misbehaving client.
MAX_CONNECTIONS = 8
# An answer reads one small file: a second is plenty, and a stuck one must not pile up.
TIMEOUT_S = 10
DOCUMENTATION = f"{GPU_HEALTH.machine_path}/metrics.py"

SANDBOX = "\n".join((
    "# It reads one record (0644, counts, times and figures) and writes nothing: a dynamic user, no",
    "# privileges, nothing of the system writable, no devices, no sockets of its own (the connection",
    "# is handed to it).",
    "DynamicUser=yes",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectControlGroups=yes",
    "CapabilityBoundingSet=",
    "RestrictAddressFamilies=AF_UNIX",
))


def _exec(which: str, record: str) -> str:
    return f"{PYTHON} -m {GPU_HEALTH.module}.metrics {which} --state {record}"


def agent_metrics_files() -> HostFiles:
    """Every GPU node's: the socket on the metrics port, and its per-connection service."""
    common = {"documentation": DOCUMENTATION}
    return {
        AGENT_SOCKET_PATH: RenderedFile(render_template(
            AGENT_SOCKET_PATH, port=wellknown.GPU_HEALTH_AGENT_METRICS_PORT, max_connections=MAX_CONNECTIONS,
            firewall_unit=node_ports.UNIT_NAME, **common)),
        AGENT_SERVICE_PATH: RenderedFile(render_template(
            AGENT_SERVICE_PATH, python_path=GPU_HEALTH.pythonpath, exec_start=_exec("agent", AGENT_RECORD),
            timeout_s=TIMEOUT_S, sandbox=SANDBOX, **common)),
    }


def controller_metrics_files(host: str, address: str) -> HostFiles:
    """An apiserver VM's (where the controller runs): the socket on its own address, and the service."""
    common = {"documentation": DOCUMENTATION, "host": host}
    return {
        CONTROLLER_SOCKET_PATH: RenderedFile(render_template(
            CONTROLLER_SOCKET_PATH, address=address, port=wellknown.GPU_HEALTH_CONTROLLER_METRICS_PORT,
            max_connections=MAX_CONNECTIONS, **common)),
        CONTROLLER_SERVICE_PATH: RenderedFile(render_template(
            CONTROLLER_SERVICE_PATH, python_path=GPU_HEALTH.pythonpath,
            exec_start=_exec("controller", CONTROLLER_RECORD), timeout_s=TIMEOUT_S, sandbox=SANDBOX, **common)),
    }
