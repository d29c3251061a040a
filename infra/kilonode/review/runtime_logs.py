"""Docker's log driver moved off json-file on a pool (`container-logs-lost`, high): the twenty-first
independent trace of `kilonode diff` on research-7500 found a PR setting daemon.json's `log-driver`
to `local` reported only as a fleet rollout.

Read from each side's rendered files: every Docker pool host's etc/docker/daemon.json and, on GPU
pools, etc/docker/daemon-nvidia.json, the file dockerd reads instead where the image carries the
NVIDIA toolkit (kilonode.render.pool docker_daemon_json, DOCKER_DAEMON_NVIDIA_JSON). A key that is
absent means json-file, Docker's default (moby v20.10.24 cmd/dockerd/config.go installConfigFlags:
`--log-driver` defaults to "json-file"). The pinned Docker is Debian's docker.io 20.10.24
(node-image/binaries.toml [debian."/usr/sbin/dockerd"]), read at moby tag v20.10.24; the pinned
cri-dockerd is 0.3.26 (node-image/binaries.toml), which has no tag in the copy read here: read at
Mirantis/cri-dockerd release/0.3 665a141d (v0.3.25 and the branch tip 0.3.26 is cut from; core/
logs.go is the same at v0.3.25).

Why pod logs are lost on such a node:

- moby gives a container a LogPath only for json-file (container/container.go StartLogger: the
  json-file case sets container.LogPath to <id>-json.log; the local case keeps its files under
  local-logs/ and says "Do not set container.LogPath for the local driver"; every other driver
  writes no file at all), and inspect reports that LogPath (daemon/inspect.go).
- cri-dockerd makes the kubelet's log file, /var/log/pods/<pod>/<container>/<n>.log (the CRI
  container status's LogPath, core/container_status.go from the io.kubernetes.container.logpath
  label), a symlink to Docker's LogPath after each start (core/container_start.go ->
  core/logs.go createContainerLogSymlink): with an empty LogPath it creates nothing and only logs
  "Unsupported logging driver by CRI" (criSupportedLogDrivers = ["json-file"]).
- the kubelet reads a container's logs only from that CRI path (kubernetes
  pkg/kubelet/kuberuntime/kuberuntime_container.go GetContainerLogs -> ReadLogs(status.GetLogPath());
  read in the stored copy of the current source, not at the v1.34.2 tag: dockershim's `docker logs`
  fallback left with dockershim in 1.24). So `kubectl logs` fails for every pod there, and every node
  log collector reading /var/log/pods or /var/log/containers finds nothing.

Only new or reimaged nodes get it: daemon.json reaches a node in its scale set's custom data
(cloud-init write_files: kilonode.render.cloud_init, kilonode.azure.custom_data), and the scale sets'
upgrade policy is Manual (kilonode.azure.node_pool), so a running node keeps its old daemon.json until
it is reimaged or upgraded to the new model; the breakage grows with every node that is.

The log-opts: kilonode renders max-size/max-file from the kubelet's container-log limits
(kilonode.plan.defaults CONTAINER_LOG_MAX_SIZE, CONTAINER_LOG_MAX_FILES) so that logs stay bounded on
the runtime's disk (kilonode.preflight.checks.disks sizes the local SSD with them). A head that
drops them is said. A head that keeps an option the new driver refuses is worse: dockerd checks the
daemon's log-opts at start (daemon/daemon.go NewDaemon -> daemon/logs.go setupDefaultLogConfig ->
daemon/logger/factory.go ValidateLogOpts, each driver's ValidateLogOpt: journald and syslog refuse
max-size and max-file, "unknown log opt") and NewDaemon returns the error: Docker does not start and
the node runs no pod.

containerd pools are not judged: containerd's CRI plugin writes the kubelet's log files itself and
kilonode's config.toml (kilonode.render.pool containerd_config) has no log-driver equivalent.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.control_flags import host_nodes
from kilonode.review.finding import HIGH, MEDIUM, Finding

RULE = "container-logs-lost"
DAEMON_FILES = ("etc/docker/daemon.json", "etc/docker/daemon-nvidia.json")
DEFAULT_DRIVER = "json-file"  # moby v20.10.24 cmd/dockerd/config.go
KILONODE_OPTS = ("max-size", "max-file")  # kilonode.render.pool docker_daemon_json
# The options each driver's ValidateLogOpt accepts at moby v20.10.24 (daemon/logger/<driver>/),
# besides the built-in ones every driver takes (mode, max-buffer-size, the cache-* of the log cache).
# "none" accepts anything (factory.go ValidateLogOpts returns nil for it); drivers not listed are not
# judged on their options.
ACCEPTED_OPTS: Mapping[str, frozenset[str]] = {
    "local": frozenset({"max-size", "max-file", "compress"}),
    "journald": frozenset({"labels", "labels-regex", "env", "env-regex", "tag"}),
    "syslog": frozenset({"env", "env-regex", "labels", "labels-regex", "syslog-address", "syslog-facility",
                         "syslog-tls-ca-cert", "syslog-tls-cert", "syslog-tls-key", "syslog-tls-skip-verify",
                         "tag", "syslog-format"}),
}
BUILTIN_OPTS = frozenset({"mode", "max-buffer-size", "cache-disabled", "cache-max-size", "cache-max-file",
                          "cache-compress"})


def _daemon(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        loaded = json.loads(text)
    except ValueError:
        return None  # not Docker's to start: another rule (preflight) says a broken file
    return loaded if isinstance(loaded, dict) else None


def _driver(config: Mapping[str, Any]) -> str:
    return str(config.get("log-driver") or DEFAULT_DRIVER)


def _opts(config: Mapping[str, Any]) -> dict[str, Any]:
    opts = config.get("log-opts")
    return dict(opts) if isinstance(opts, Mapping) else {}


def _configs(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """(pool host, daemon file) -> its parsed daemon config, for every Docker pool host."""
    found = {}
    for path, text in ((entry or {}).get("files") or {}).items():
        role, _, rest = path.partition("/")
        if role.startswith("pool-") and rest in DAEMON_FILES:
            config = _daemon(text)
            if config is not None:
                found[(role, rest)] = config
    return found


def assess(diff: StackDiff) -> list[Finding]:
    if diff.head is None:
        return []
    base, head = _configs(diff.base), _configs(diff.head)
    # pool -> host -> (file, new driver, what happens to kilonode's log-opts)
    moved: dict[str, dict[str, list[str]]] = {}
    drivers: dict[str, set[str]] = {}
    subjects: dict[str, list[str]] = {}
    for (role, path), config in sorted(head.items()):
        driver = _driver(config)
        before = base.get((role, path))
        # a host new at the head counts from kilonode's own render, json-file
        if driver == DEFAULT_DRIVER or (before is not None and _driver(before) != DEFAULT_DRIVER):
            continue
        opts = _opts(config)
        was = _opts(before or {})
        notes = []
        dropped = [k for k in KILONODE_OPTS if k in was and k not in opts]
        if dropped:
            notes.append(f"drops log-opts {', '.join(dropped)} (kilonode's bound on logs on the runtime's disk)")
        accepted = ACCEPTED_OPTS.get(driver)
        refused = sorted(k for k in opts if accepted is not None and k not in accepted and k not in BUILTIN_OPTS)
        if refused:
            notes.append(f"keeps log-opts {', '.join(refused)}, which {driver} refuses (\"unknown log opt\"): "
                         "dockerd fails at start (NewDaemon -> setupDefaultLogConfig) and the node runs no pod")
        pool = role.split(".", 1)[0]
        moved.setdefault(pool, {}).setdefault(role, []).append(
            f"{path.rpartition('/')[2]} {driver}" + (f", {'; '.join(notes)}" if notes else ""))
        drivers.setdefault(pool, set()).add(driver)
        subjects.setdefault(pool, []).append(f"{role}/{path}")
    if not moved:
        return []
    nodes = host_nodes(diff.head)
    found = []
    for pool, hosts in sorted(moved.items()):
        count = sum(nodes.get(role, 0) for role in hosts)
        where = "; ".join(f"{role} ({nodes.get(role, 0):,} nodes): {', '.join(parts)}"
                          for role, parts in sorted(hosts.items()))
        new = "/".join(sorted(drivers[pool]))
        found.append(Finding(
            HIGH, RULE,
            f"{pool} ({count:,} nodes): Docker's log-driver moves from json-file to {new} ({where}). Docker gives "
            "a container a log file path only with json-file (moby at the pinned Docker, "
            "container/container.go StartLogger: "
            "\"Do not set container.LogPath for the local driver\"), so cri-dockerd makes no /var/log/pods symlink "
            "(core/logs.go createContainerLogSymlink, criSupportedLogDrivers [json-file]) and the kubelet, which "
            "reads logs only there (kuberuntime_container.go GetContainerLogs -> ReadLogs(status.GetLogPath())), "
            "has none: `kubectl logs` fails for every pod on those nodes and node log collectors reading "
            "/var/log/pods or /var/log/containers get nothing. Only new and reimaged nodes get it (daemon.json is "
            "in the scale sets' custom data, upgrade policy Manual): the breakage spreads with each reimage, "
            "running nodes keep json-file until then. Keep \"log-driver\": \"json-file\" with its log-opts "
            "(kilonode.render.pool docker_daemon_json); ship logs elsewhere with a collector reading /var/log/pods",
            tuple(sorted(subjects[pool]))))
    return found


# ---- live-restore-off (trace 22, P02) ---------------------------------------------------------------------------
# kilonode sets Docker's `live-restore` (kilonode.render.pool: "a dockerd restart must not kill them", the field
# notes' semi-stateful pods). Without it, dockerd's shutdown stops every running container (moby v20.10.24
# daemon/daemon.go (*Daemon).Shutdown: containers are kept only `if cfg.LiveRestoreEnabled`), so any restart of the
# daemon on a node (a crash, an OOM kill, a package or config reload that restarts docker.service) kills every
# container there: one rank of each gang on it, and so the gang.
LIVE_RESTORE_RULE = "live-restore-off"


def live_restore_off(diff: StackDiff) -> list[Finding]:
    if diff.head is None:
        return []
    base, head = _configs(diff.base), _configs(diff.head)
    off: dict[str, list[str]] = {}
    for (role, path), config in sorted(head.items()):
        before = base.get((role, path))
        if config.get("live-restore") is True or before is None or before.get("live-restore") is not True:
            continue
        off.setdefault(role, []).append(f"{role}/{path}")
    if not off:
        return []
    nodes = host_nodes(diff.head)
    said = ", ".join(f"{role} ({nodes.get(role, 0):,} nodes)" for role in sorted(off))
    return [Finding(MEDIUM, LIVE_RESTORE_RULE, (
        f"Docker's live-restore turned off on {said}: from then on any restart of dockerd on such a node (a crash, "
        "an OOM kill, a restart of docker.service) stops every container on it (moby at the pinned "
        "Docker, daemon/daemon.go "
        "(*Daemon).Shutdown keeps them only with live-restore), so each gang with a rank there loses its run since "
        "its checkpoint. Only new or reimaged nodes get it (custom data, Manual upgrade policy), so the fleet runs "
        "both until rolled. kilonode sets it for the field notes' semi-stateful pods (kilonode.render.pool): keep "
        "`\"live-restore\": true`"), tuple(p for paths in off.values() for p in paths))]
