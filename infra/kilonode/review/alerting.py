"""Prometheus rule files a change touches, checked by Prometheus' own checker at review time.

The rule files are data keys of the in-cluster ConfigMaps: each key a Prometheus config there
names under `rule_files`, and each key whose YAML is a rule file (`groups:`). Every one the
change adds or alters is written out and given to `promtool check rules` (promtool, located by
`locate`). One that promtool rejects is a high risk, because of what Prometheus does with it
(prometheus/prometheus@v3.5.5, the version the catalogue pins):

- the running server notices the changed file (kilonode's Prometheus runs with
  `--enable-feature=auto-reload-config`: cmd/prometheus/main.go:1222-1240 compares, every
  `--config.auto-reload-interval`, a checksum that covers every rule file's content,
  config/reload.go:33-92; the kubelet updates a ConfigMap volume's files in place) and
  reloads: the rules reloader calls the rule manager's Update (cmd/prometheus/main.go:998-1021),
  which on a file it cannot load logs "loading groups failed" and returns "error loading rules,
  previous rule set restored" (rules/manager.go:209-229): the old rules keep evaluating,
  prometheus_config_last_reload_successful drops to 0, and nothing else says so;
- at its next start (a reschedule, an upgrade, the node reimaged) the initial load fails: "error
  loading config from ..." (cmd/prometheus/main.go:1265-1266) ends the run group, and `main` logs
  "Fatal error" and exits 1 (cmd/prometheus/main.go:1430-1432). The pod crash-loops: no rule is
  evaluated and no alert fires, for any cause.

A rule file promtool rejects at the base as well (the promtool found here is older than the
pinned server and may not know its newer syntax) is not judged: the report says so. With no
promtool at all, the change is not judged either, and the report says that instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, Finding
from kilonode.review.lifecycle import load_yaml, plan_of

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
PROMTOOL_ENV = "KILONODE_PROMTOOL"
CHECK_TIMEOUT_S = 60
# the lines, at the pinned release, are in this module's docstring (a literal holds no version)
SOURCE = ("prometheus/prometheus rules/manager.go Update: \"error loading rules, previous rule set restored\"; "
          "cmd/prometheus/main.go: a failed first load exits 1")


def locate() -> Path | None:
    """promtool: $KILONODE_PROMTOOL, else on PATH, else the newest one `make test-artefacts`
    unpacked from Debian's prometheus into ${XDG_CACHE_HOME:-~/.cache}/kilonode/tools/."""
    named = os.environ.get(PROMTOOL_ENV)
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    found = shutil.which("promtool")
    if found:
        return Path(found)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kilonode" / "tools"
    unpacked = sorted(p for p in cache.glob("promtool-*") if not p.name.endswith(".partial") and os.access(p, os.X_OK))
    return unpacked[-1] if unpacked else None


def rule_files(entry: Mapping[str, Any] | None) -> dict[str, str]:
    """"ConfigMap <namespace>/<name> key" -> text, for every rule file of the side's ConfigMaps."""
    found = {}
    for r in (entry or {}).get("resources", []):
        if r.get("type") != CONFIG_MAP:
            continue
        meta = (r.get("inputs") or {}).get("metadata") or {}
        data = (r.get("inputs") or {}).get("data") or {}
        named = _named_rule_files(data)
        for key, text in data.items():
            if isinstance(text, str) and (key in named or _is_rule_file(text)):
                found[f"ConfigMap {meta.get('namespace', 'default')}/{meta.get('name', r.get('name'))} {key}"] = text
    return found


def _named_rule_files(data: Mapping[str, Any]) -> set[str]:
    """The keys a Prometheus config in the same ConfigMap loads as rule files (by file name)."""
    named = set()
    for text in data.values():
        config = _load(text)
        if isinstance(config, Mapping) and isinstance(config.get("rule_files"), list):
            named |= {Path(str(pattern)).name for pattern in config["rule_files"]}
    return named


def _is_rule_file(text: str) -> bool:
    document = _load(text)
    return isinstance(document, Mapping) and isinstance(document.get("groups"), list)


def _load(text: Any) -> Any:
    try:
        return load_yaml(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None


def check(promtool: Path, text: str) -> str | None:
    """promtool's complaint about one rule file, or None when it accepts it."""
    with tempfile.TemporaryDirectory(prefix="kilonode-rules-") as tmp:
        path = Path(tmp) / "rules.yaml"
        path.write_text(text, encoding="utf-8")
        done = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT_S, check=False)
    if done.returncode == 0:
        return None
    lines = [line.strip().replace(str(path), "rules.yaml") for line in (done.stdout + done.stderr).splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith("Checking")) or f"exit {done.returncode}"


def _version(promtool: Path) -> str:
    try:
        done = subprocess.run([str(promtool), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "promtool"
    match = re.search(r"version (\S+)", done.stdout + done.stderr)
    return f"promtool {match.group(1)}" if match else "promtool"


def assess(diff: StackDiff) -> list[Finding]:
    if not any(c.type == CONFIG_MAP for c in diff.resources):
        return []  # no ConfigMap changed: no rule file did
    before, after = rule_files(diff.base), rule_files(diff.head)
    changed = {key: text for key, text in after.items() if before.get(key) != text}
    if not changed:
        return []
    promtool = locate()
    if promtool is None:
        diff.note(f"alert rules ({', '.join(sorted(changed))}) changed and were not checked: no promtool here "
                  f"(put it on PATH or name it in ${PROMTOOL_ENV}; `make test-artefacts` unpacks Debian's)")
        return []
    version = _version(promtool)
    server = (plan_of(diff.head).get("components") or {}).get("prometheusImage") or "the pinned Prometheus"
    found = []
    for key, text in sorted(changed.items()):
        problem = check(promtool, text)
        if problem is None:
            continue
        if key in before and check(promtool, before[key]) is not None:
            diff.note(f"{key}: {version} rejects the base's rules too, so the change to them is not judged "
                      f"(the cluster runs {server})")
            continue
        found.append(Finding(HIGH, "alert-rules-rejected", (
            f"{key}: {version} rejects the rule file ({problem}). Prometheus rejects the reload and keeps the old "
            "rules, saying so only in prometheus_config_last_reload_successful; at its next start it exits: "
            f"alerting is gone ({SOURCE}). Checked with {version}; the cluster runs {server}. Fix the rule, and run "
            "`promtool check rules` on it before merging"), (key,)))
    return found
