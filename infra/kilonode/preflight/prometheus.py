"""Readers of the Prometheus configuration a side deploys: the ConfigMap key its container's `--config.file`
names, the scrape configuration files that file pulls in, and each job's scrape interval.

Pure functions of a recorded graph in its JSON form (`{"resources": [{"type", "name", "inputs"}, ...]}`, what
`kilonode plan --format json` writes and a review snapshot holds), so that preflight (prometheus-load) and the
review (kilonode.review.alerting, which imports them from here: preflight may not import the review, and the
review may import preflight) read the deployed configuration one way. `graph_of` gives preflight's Inputs that
form.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from kilonode.preflight.model import Inputs
from kilonode.yamlio import load_yaml

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
WORKLOADS = ("kubernetes:apps/v1:StatefulSet", "kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet")
CONFIG_FLAG = "--config.file"
_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
DEFAULT_SCRAPE_INTERVAL_S = 60.0
def graph_of(inputs: Inputs) -> dict[str, Any]:
    """Preflight's recorded graph in the JSON form these readers take."""
    return {"resources": [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in inputs.resources]}


def load(text: Any) -> Any:
    """A YAML text as safe_load reads it; None where it is not text or not YAML."""
    try:
        return load_yaml(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None


def seconds(duration: Any) -> float | None:
    """A Prometheus duration ("1m30s", "5m") in seconds; None where it is not one."""
    text = str(duration or "").strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def scrape_documents(entry: Mapping[str, Any] | None) -> Iterator[Mapping[str, Any]]:
    """Every Prometheus configuration (a document with scrape_configs) among the side's ConfigMaps."""
    for r in (entry or {}).get("resources", []):
        if r.get("type") != CONFIG_MAP:
            continue
        for text in ((r.get("inputs") or {}).get("data") or {}).values():
            config = load(text)
            if not isinstance(config, Mapping) or not isinstance(config.get("scrape_configs"), list):
                continue
            yield config


def scrape_intervals(entry: Mapping[str, Any] | None) -> dict[str, float]:
    """job_name -> its scrape interval in seconds (its own, else the config's global, else 1m), over every
    Prometheus config of the side's ConfigMaps."""
    found: dict[str, float] = {}
    for config in scrape_documents(entry):
        default = seconds((config.get("global") or {}).get("scrape_interval")) or DEFAULT_SCRAPE_INTERVAL_S
        for job in config["scrape_configs"]:
            if isinstance(job, Mapping) and job.get("job_name"):
                found[str(job["job_name"])] = seconds(job.get("scrape_interval")) or default
    return found


def prometheus_configs(entry: Mapping[str, Any] | None) -> dict[str, tuple[dict[str, str], str]]:
    """"ConfigMap <namespace>/<name> <key>" -> (that ConfigMap's data, key), for the configuration file each
    Prometheus of the side loads: a container's `--config.file` under one of its ConfigMap volumes' mounts."""
    return {label: (data, key) for _, label, data, key in _loaders(entry)}


def prometheus_workloads(entry: Mapping[str, Any] | None) -> set[tuple[str, str]]:
    """(namespace, name) of each workload whose container loads a Prometheus configuration (prometheus_configs)."""
    return {workload for workload, _, _, _ in _loaders(entry)}


def _alertmanager(text: str) -> bool:
    """An Alertmanager configuration: `route` and `receivers` at its top (prometheus/alertmanager config/config.go
    Config at v0.34.0), keys a Prometheus configuration refuses (unknown fields). Alertmanager's container takes
    `--config.file` too (kilonode.k8s.alertmanager): this tells the two apart."""
    config = load(text)
    return isinstance(config, Mapping) and "route" in config and "receivers" in config


def _loaders(entry: Mapping[str, Any] | None) -> Iterator[tuple[tuple[str, str], str, dict[str, str], str]]:
    """((namespace, workload), "ConfigMap <namespace>/<name> <key>", that ConfigMap's data, key) for each container
    loading a Prometheus configuration."""
    resources = [r for r in (entry or {}).get("resources", []) if isinstance(r, Mapping)]
    maps: dict[tuple[str, str], dict[str, str]] = {}
    for r in resources:
        if r.get("type") == CONFIG_MAP:
            meta = (r.get("inputs") or {}).get("metadata") or {}
            data = (r.get("inputs") or {}).get("data") or {}
            maps[(meta.get("namespace", "default"), meta.get("name", r.get("name")))] = {
                k: v for k, v in data.items() if isinstance(v, str)}
    for r in resources:
        if r.get("type") not in WORKLOADS:
            continue
        inputs = r.get("inputs") or {}
        namespace = (inputs.get("metadata") or {}).get("namespace", "default")
        workload = (namespace, str((inputs.get("metadata") or {}).get("name", r.get("name"))))
        pod = ((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        volumes = {v.get("name"): v.get("configMap") for v in pod.get("volumes") or []
                   if isinstance(v, Mapping) and isinstance(v.get("configMap"), Mapping)}
        for container in pod.get("containers") or []:
            path = config_flag(container) if isinstance(container, Mapping) else None
            if not path:
                continue
            for mount in container.get("volumeMounts") or []:
                source = volumes.get(mount.get("name")) if isinstance(mount, Mapping) else None
                if not source:
                    continue
                key = _mounted_key(path, mount, source)
                name = str(source.get("name"))
                data = maps.get((namespace, name))
                if key and data is not None and key in data and not _alertmanager(data[key]):
                    yield workload, f"ConfigMap {namespace}/{name} {key}", data, key


def config_flag(container: Mapping[str, Any]) -> str | None:
    """The container's --config.file (`--config.file=X` or `--config.file X`), absolute, or None."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, word in enumerate(words):
        value = word.partition("=")[2] if word.startswith(CONFIG_FLAG + "=") else (
            words[i + 1] if word == CONFIG_FLAG and i + 1 < len(words) else None)
        if value and value.startswith("/"):
            return value
    return None


def _mounted_key(path: str, mount: Mapping[str, Any], source: Mapping[str, Any]) -> str | None:
    """The ConfigMap key a ConfigMap volume mount shows at `path` (its items' paths, else the keys as
    file names; a subPath mount is that one entry at the mount path)."""
    at = str(mount.get("mountPath") or "").rstrip("/")
    if mount.get("subPath"):
        relative = str(mount["subPath"]) if path == at else ""
    else:
        relative = path[len(at) + 1:] if at and path.startswith(at + "/") else ""
    if not relative:
        return None
    items = {str(i.get("path")): str(i.get("key")) for i in source.get("items") or [] if isinstance(i, Mapping)}
    if items:
        return items.get(relative)
    return relative if "/" not in relative else None


def _loaded(entry: Mapping[str, Any] | None) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    """(each configuration a Prometheus of the side loads, the scrape configuration files it pulls in)."""
    for data, key in prometheus_configs(entry).values():
        config = load(data[key])
        if not isinstance(config, Mapping):
            continue
        fragments = []
        for pattern in config.get("scrape_config_files") or []:
            for name in sorted(data):
                fragment = load(data[name]) if name != key and fnmatch.fnmatchcase(name, Path(str(pattern)).name) \
                    else None
                if isinstance(fragment, Mapping) and isinstance(fragment.get("scrape_configs"), list):
                    fragments.append(fragment)
        yield config, fragments


def deployed_scrape_documents(entry: Mapping[str, Any] | None) -> Iterator[Mapping[str, Any]]:
    """The Prometheus configurations the side's Prometheus loads (its --config.file, prometheus_configs) and the
    keys of the same ConfigMap its `scrape_config_files` name (prometheus/prometheus@v3.5.5 config/config.go:338-339,
    GetScrapeConfigs: each a glob, its jobs added to the file's); every document with scrape_configs
    (scrape_documents) where no workload names one. A fragment beside the file that no `scrape_config_files`
    names (kilonode-scrape-configs.yaml) is not scraped."""
    if not prometheus_configs(entry):
        yield from scrape_documents(entry)
        return
    for config, fragments in _loaded(entry):
        if isinstance(config.get("scrape_configs"), list):
            yield config
        yield from fragments


def deployed_scrape_intervals(entry: Mapping[str, Any] | None) -> dict[str, float]:
    """job_name -> its scrape interval in seconds, over the configuration the side's Prometheus loads and the files
    it pulls in: the job's own, else the loaded file's global one, else 1m (prometheus/prometheus@v3.5.5
    config/config.go GetScrapeConfigs validates a pulled-in file's jobs against the loading file's global
    section: ScrapeConfig.Validate sets an unset scrape_interval to the global one). Empty where no workload
    loads a configuration."""
    found: dict[str, float] = {}
    for config, fragments in _loaded(entry):
        default = seconds((config.get("global") or {}).get("scrape_interval")) or DEFAULT_SCRAPE_INTERVAL_S
        documents = [config] if isinstance(config.get("scrape_configs"), list) else []
        for document in [*documents, *fragments]:
            for job in document["scrape_configs"]:
                if isinstance(job, Mapping) and job.get("job_name"):
                    found[str(job["job_name"])] = seconds(job.get("scrape_interval")) or default
    return found
