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

A second rule (`metric-dropped`, high), from a second independent trace on research-7500: a
scrape config change that drops a metric the rules read (apiserver_request_total added to the
apiserver job's `metric_relabel_configs` drop list) passes promtool, and silences every alert built
on it. A `metric_relabel_configs` entry with `action: drop` (or `keep`) and `source_labels:
[__name__]` is applied to every scraped sample before ingestion, its regex fully anchored
(prometheus/prometheus@v3.5.5 model/relabel/relabel.go: Config.Regex is anchored "^(?:" ... ")$",
Drop removes a matching series, Keep one that does not match; docs "metric_relabel_configs"), so the
series never exist and a rule over them returns nothing. Judged on the head's rendered Prometheus
config against the metric names each alert reads (kilonode.review.alerting.metric_names: the vector
selectors of the PromQL's syntax tree, recording rules followed to their sources): a metric a rule
selects with `job="X"` is held to job X's relabelling, one without a
job to any job's drop list (a keep list only where the job is known).

A third rule (`range-too-short`, high), from a third independent trace on research-7500: a rate,
irate, increase, delta, idelta or deriv over a range shorter than twice the scrape interval of the
job its selector names returns nothing, and promtool passes it. Since Prometheus v3 a range is
left-open and right-closed (prometheus/prometheus@v3.5.5 docs/migration.md:79-91, "Range selectors
and lookback exclude samples coinciding with the left boundary": with samples 1m apart, `5m` always
holds 5), so a range of one interval holds one sample, and one under two intervals holds two only
at some evaluations; extrapolatedRate returns no element under two samples
(promql/functions.go:72-125, "We need either at least two Histograms and no Floats, or at least two
Floats"), as do instantValue (irate, idelta: functions.go:310-323) and deriv (functions.go:1252-1260).
An alert on it never fires (with a `for:` the gaps reset it pending). Judged on the head's rendered
rules and scrape configs (the same readers as `metric-dropped`, recording rules followed), for a
selector naming its job (`job="X"`, or `job=~"re"` against the jobs' names), reported only where
newly true against the base.

A fourth (`scrape-past-lookback`, medium), from a fourth independent trace: an alert reading, as an
instant vector, a job scraped at or past the 5m lookback (v3: open at its older end) drops out of
its result on any late scrape and loses its pending `for:`; the same readers, newly true only.

A fifth (`scrape-config-rejected`, high), from a fifth independent trace: a change that makes the
Prometheus configuration itself invalid (`scrape_timeout: 2m` on a job scraped every 30s) is only a
ConfigMap replace to the rest of the review. Prometheus validates every scrape config when it loads the
file (prometheus/prometheus@v3.5.5 config/config.go:409-412, Config.UnmarshalYAML calling
ScrapeConfig.Validate, l.822-832: "scrape timeout greater than scrape interval for scrape config with job
name ..."), so:

- the running server sees the file's checksum change (cmd/prometheus/main.go:1222-1233, the same
  auto-reload as above) and reloadConfig fails at config.LoadFile: "couldn't load configuration
  (--config.file=...)", prometheus_config_last_reload_successful set to 0 (main.go:1494-1512), "Error
  reloading config" logged (main.go:1236), the old configuration kept, and retried every interval;
- at its next start (any new pod: a reimage, an eviction, a template change, `prometheus-restarted`) main
  loads the file before anything else and exits 2 on the error: "Error loading config
  (--config.file=...)" (cmd/prometheus/main.go:631-640). The pod crash-loops: nothing is scraped, no
  rule evaluated, no alert fires.

The configuration judged is the ConfigMap key each side's Prometheus loads: its container's
`--config.file` under a ConfigMap volume's mount (kilonode.k8s.monitoring: prometheus.yml at
/etc/prometheus/kilonode). Where the change alters it, the ConfigMap's keys are written into a temporary
directory as the volume lays them out and `promtool check config --syntax-only` (2.33+: the file's own
syntax and validation, without opening the rule and credentials files it names, which exist only in the
pod and the rules have their own check above) is run on it. Debian's promtool (2.42, the one `make
test-artefacts` unpacks) is built without some service discoveries, Kubernetes' among them, and rejects
every `kubernetes_sd_configs` block; a block of a discovery that the pinned server has (DISCOVERIES) and
that promtool says it does not know is set aside, on both sides, and the finding says so. An unknown
field of any other name stays a rejection.

A sixth (`recording-rule-missing`, high), from a sixth independent trace: a recording rule renamed
(`kilonode:etcd_db_quota:ratio` recorded under another name) while the alerts still read the old name
passes promtool (each rule is checked alone) and silences both KilonodeEtcdDatabaseNearQuota alerts: a
name with ':' is a recording rule's by Prometheus' naming convention (prometheus/docs
content/docs/practices/rules.md, "Naming and aggregation": level:metric:operations; docs/concepts/
data_model.md: the colons are reserved for user-defined recording rules, never exporters'), so no job scrapes it,
and once no rule writes it the series goes stale and the expression returns nothing. Judged on the
head's rules (the alerts' reads, recording rules followed: _per_alert) against the names the head's
recording rules record, for names the base recorded.

A seventh (`alert-selects-no-job`, high), from an eighth independent trace: the rules' `job="kilonode-apiserver"`
changed to the kube-prometheus mixin's `job="apiserver"`, a job no scrape config of kilonode's defines, so
kilonode:apiserver_requests:rate5m records nothing and the four apiserver alerts can never fire; promtool passes
it. Judged on the head's rules, their selectors read from the PromQL's syntax tree (`selectors`), against the job
label values the head's scrapes give (`scrape_jobs`: each
job_name, static labels and literal relabellings to `job`; not judged, with a note, where a job's label is set at
scrape time), for each (rule, job matcher) that named a scraped job at the base or is new; the alerts named are those
reading the rule, through recording rules. Preflight does not check it: a blind alert breaks no bring-up, and the
review alone sees what the base selected.

The PromQL is parsed by promql_parser (PyPI promql-parser, messense/py-promql-parser, MIT: Python bindings of
GreptimeTeam/promql-parser, Apache-2.0, whose README declares PromQL compatible with Prometheus v3.8; 0.12.0 embeds
the crate at 0.11.1), not by hand: a maintained parser (both projects released every one to three months through
2026) with wheels for CPython 3.11 on manylinux x86_64 and aarch64, and a typed tree (VectorSelector, MatrixSelector,
Call, AggregateExpr, BinaryExpr, SubqueryExpr; matchers with op, name, value). promtool has no command that parses an
expression alone. Checked against every expression of the shipped stacks' rules (112 rules, 45 distinct expressions,
84 selectors, 76 matchers, 44 of them on `job`) and the tests': every one parsed, its selectors and matchers are
those the lexer-following scanner it replaced (a2536be) read, and its metric names those the regular expressions
before it read. Its known gaps, each a parse error here
(the rule then noted, `unreadable`, never misread): a backquoted raw string holding a backslash (Prometheus takes
it verbatim, prometheus/prometheus@v3.5.5 promql/parser/lex.go:845-861 lexRawString, lex_test.go:235-236; the crate
rejects it: GreptimeTeam/promql-parser@v0.10.0 src/parser/lex.rs test_strings asserts so), digit separators
(`1_000`, lex.go:940-951), and depth: memory quadratic in the tree's depth and a native stack overflow at a few
thousand levels (MAX_EXPR_CHARS, where it is bounded). It is more lenient than Prometheus in ways a reader does
not mind (`{a="b" or c="d"}`, experimental functions without their feature flag): promtool judges validity.

A rule file or configuration promtool rejects at the base as well (the promtool found here is older
than the pinned server and may not know its newer syntax) is not judged: the report says so. With no
promtool at all, the change is not judged either, and the report says that instead.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import promql_parser
import yaml

from kilonode.catalog import CATALOG_DIR
from kilonode.plan import defaults
from kilonode.preflight.prometheus import deployed_scrape_documents as _deployed_scrape_documents
from kilonode.preflight.prometheus import load as _load
from kilonode.preflight.prometheus import prometheus_configs, scrape_intervals, seconds
from kilonode.preflight.prometheus import scrape_documents as _scrape_documents
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
PROMTOOL_ENV = "KILONODE_PROMTOOL"
CHECK_TIMEOUT_S = 60
# the lines, at the pinned release, are in this module's docstring (a literal holds no version)
SOURCE = ("prometheus/prometheus rules/manager.go Update: \"error loading rules, previous rule set restored\"; "
          "cmd/prometheus/main.go: a failed first load exits 1")
CONFIG_SOURCE = ("prometheus/prometheus config/config.go ScrapeConfig.Validate; cmd/prometheus/main.go reloadConfig: "
                 "\"couldn't load configuration\", the old one kept; main: a config that does not load exits 2")
# Every discovery prometheus/prometheus@v3.5.5 registers (discovery/*: each SDConfig's Name(), its YAML key
# `<name>_sd_configs`, discovery/registry.go:51): one a promtool here was built without is set aside.
DISCOVERIES = frozenset({
    "azure", "consul", "digitalocean", "dns", "docker", "dockerswarm", "eureka", "file", "gce", "hetzner", "http",
    "ionos", "kubernetes", "kuma", "lightsail", "linode", "marathon", "nerve", "nomad", "openstack", "ovhcloud",
    "puppetdb", "scaleway", "serverset", "stackit", "triton", "uyuni", "vultr"})
_UNBUILT = re.compile(r"field (\w+)_sd_configs not found in type config\.(?:ScrapeConfig|AlertmanagerConfig)")
_JOB_NAMED = re.compile(r'job name "([^"]+)"')


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


def metric_names(expr: str) -> dict[str, set[str]]:
    """The metric names a PromQL expression selects -> the jobs its selectors name with `job="..."` ('' for a
    selector naming none), from promql_parser's tree (`scan`); {} for an expression it does not read (`unreadable`:
    assess notes those)."""
    try:
        read = selectors(expr)
    except PromQLSyntax:
        return {}
    names: dict[str, set[str]] = {}
    for selector in read:
        jobs = {value for label, op, value in selector.matchers if label == "job" and op == "="}
        for metric in [selector.metric] if selector.metric else _name_alternatives(selector):
            names.setdefault(metric, set()).update(jobs or {""})
    return names


# A metric name, alone: what a `{__name__=~"A|B|C"}` alternation of literal names is made of.
_LITERAL_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _name_alternatives(selector: Selector) -> list[str]:
    """The names of `{__name__=~"A|B|C"}` where the regex is nothing but literal names (Prometheus anchors it:
    model/relabel and promql's matchers fully match, so it selects exactly those); [] for any other regex."""
    for label, op, value in selector.matchers:
        if label == _METRIC_LABEL and op == "=~":
            parts = value.split("|")
            if all(_LITERAL_NAME.fullmatch(p) for p in parts):
                return parts
    return []


def alert_rules(entry: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """Every rule (alerting and recording) of the side's rule files."""
    found = []
    for text in rule_files(entry).values():
        document = _load(text)
        for group in (document or {}).get("groups") or [] if isinstance(document, Mapping) else []:
            found += [r for r in (group or {}).get("rules") or [] if isinstance(r, Mapping) and r.get("expr")]
    return found


def _relabel_filters(entry: Mapping[str, Any] | None) -> dict[str, list[tuple[str, str]]]:
    """job -> its (action, regex) on __name__ from metric_relabel_configs, over every Prometheus config
    of the side's ConfigMaps (a document with scrape_configs)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for config in _scrape_documents(entry):
        for job in config["scrape_configs"]:
            if not isinstance(job, Mapping):
                continue
            for relabel in job.get("metric_relabel_configs") or []:
                if isinstance(relabel, Mapping) and relabel.get("source_labels") == ["__name__"] and \
                        relabel.get("action") in ("drop", "keep"):
                    found.setdefault(str(job.get("job_name")), []).append(
                        (str(relabel["action"]), str(relabel.get("regex", "(.*)"))))
    return found


# The series the scrape loop writes of each scrape itself: added through reportSampleMutator (target
# labels only), never through metric_relabel_configs' sampleMutator (prometheus/prometheus v3.5.5
# scrape/scrape.go:2103 report, 2178-2191 addReportSample), so no keep or drop list removes them.
_REPORT_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                            "scrape_samples_post_metric_relabeling", "scrape_series_added"})


def _dropped_by(metric: str, jobs: set[str], filters: Mapping[str, list[tuple[str, str]]]) -> list[str]:
    """The jobs whose metric relabelling removes `metric` (Prometheus anchors the regex)."""
    if metric in _REPORT_SERIES:
        return []
    found = []
    for job, rules in filters.items():
        known = job in jobs
        if not known and "" not in jobs:
            continue
        for action, regex in rules:
            try:
                hit = re.fullmatch(regex, metric) is not None
            except re.error:
                continue
            if (action == "drop" and hit) or (action == "keep" and not hit and known):
                found.append(job)
                break
    return found


T = TypeVar("T")


def _records(rules: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Recording rule name -> the expressions recording it."""
    records: dict[str, list[str]] = {}
    for rule in rules:
        if rule.get("record"):
            records.setdefault(str(rule["record"]), []).append(str(rule["expr"]))
    return records


def _per_alert(rules: list[Mapping[str, Any]], find: Callable[[str], set[T]]) -> dict[str, set[T]]:
    """alert name -> what `find` finds in its expression, or in the recording rules it reads (followed
    through, each once per path): the walk short_range_reads and stale_instant_reads share."""
    records = _records(rules)

    def reads(expr: str, seen: frozenset[str]) -> set[T]:
        found = find(expr)
        for name in metric_names(expr):
            if name in records and name not in seen:
                for inner in records[name]:
                    found |= reads(inner, seen | {name})
        return found

    found: dict[str, set[T]] = {}
    for rule in rules:
        if rule.get("alert"):
            hits = reads(str(rule["expr"]), frozenset())
            if hits:
                found.setdefault(str(rule["alert"]), set()).update(hits)
    return found


def dropped_reads(entry: Mapping[str, Any] | None) -> dict[str, dict[str, list[str]]]:
    """alert name -> {metric it reads (through recording rules) -> the jobs that drop it}."""
    rules = alert_rules(entry)
    filters = _relabel_filters(entry)
    if not filters:
        return {}
    records = _records(rules)

    def sources(expr: str, seen: frozenset[str]) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for name, jobs in metric_names(expr).items():
            if name in records and name not in seen:
                for inner in records[name]:
                    for n, j in sources(inner, seen | {name}).items():
                        found.setdefault(n, set()).update(j)
            else:
                found.setdefault(name, set()).update(jobs)
        return found

    found: dict[str, dict[str, list[str]]] = {}
    for rule in rules:
        if not rule.get("alert"):
            continue
        for metric, jobs in sources(str(rule["expr"]), frozenset()).items():
            by = _dropped_by(metric, jobs, filters)
            if by:
                found.setdefault(str(rule["alert"]), {})[metric] = by
    return found


# the functions that need two samples in their range (the module docstring cites where)
_RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "deriv")
_RANGED = re.compile(r"\b(" + "|".join(_RANGE_FUNCTIONS) + r")\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*"
                     r"(\{[^}]*\})?\s*\[\s*([0-9a-z]+)\s*\]")
_JOB_MATCHER = re.compile(r'\bjob\s*(=~|=)\s*"([^"]*)"')


def _short_ranges(expr: str, intervals: Mapping[str, float]) -> set[tuple[str, str, str, float]]:
    """(function(metric[range]), job, range, interval) for each ranged call in `expr` whose range is
    under twice the scrape interval of a job its selector names (a subquery, `[5m:1m]`, is not one)."""
    found = set()
    for function, metric, matchers, window in _RANGED.findall(expr):
        length = seconds(window)
        if length is None:
            continue
        for op, value in _JOB_MATCHER.findall(matchers or ""):
            jobs = [value] if op == "=" else [j for j in intervals if _fullmatch(value, j)]
            for job in jobs:
                interval = intervals.get(job)
                if interval and length < 2 * interval:
                    found.add((f"{function}({metric}[{window}])", job, window, interval))
    return found


def _fullmatch(regex: str, text: str) -> bool:
    try:
        return re.fullmatch(regex, text) is not None  # PromQL anchors =~ like relabelling does
    except re.error:
        return False


def short_range_reads(entry: Mapping[str, Any] | None) -> dict[str, set[tuple[str, str, str, float]]]:
    """alert name -> the too-short ranged calls it reads, itself or through recording rules."""
    intervals = scrape_intervals(entry)
    if not intervals:
        return {}
    return _per_alert(alert_rules(entry), lambda expr: _short_ranges(expr, intervals))


def ranges_too_short(diff: StackDiff) -> list[Finding]:
    """Alerts that newly read a rate (or irate, increase, ...) over less than two of its job's scrape
    intervals: no result, so the alert never fires."""
    before, after = short_range_reads(diff.base), short_range_reads(diff.head)
    groups: dict[tuple[str, str, float], tuple[set[str], set[str]]] = {}
    for alert, calls in after.items():
        for call, job, window, interval in calls - before.get(alert, set()):
            jobs, alerts = groups.setdefault((call, window, interval), (set(), set()))
            jobs.add(job)
            alerts.add(alert)
    return [Finding(HIGH, "range-too-short", (
        f"{call} over job {', '.join(sorted(jobs))}, scraped every {interval:g}s: a range under two scrape intervals "
        f"({2 * interval:g}s) {_holds(window, interval)} (Prometheus 3's ranges are left-open, docs/migration.md; "
        "rate, irate, increase and delta return nothing without two samples, promql/functions.go extrapolatedRate), "
        f"so {', '.join(sorted(alerts))} {_fires(window, interval)} (promtool checks syntax and passes it). Make "
        f"the range at least {2 * interval:g}s (four intervals is the usual margin), or scrape the job more often"),
        tuple(sorted(alerts)), cause=f"{call} too short")
        for (call, window, interval), (jobs, alerts) in sorted(groups.items())]


def _holds(window: str, interval: float) -> str:
    if (seconds(window) or 0) <= interval:
        return "holds at most one sample at every evaluation"
    return ("holds two samples at some evaluations only, or at none, as each target's scrape times fall against "
            "the rule's evaluations")


def _fires(window: str, interval: float) -> str:
    if (seconds(window) or 0) <= interval:
        return "can never fire"
    return "can never fire, or only intermittently (each evaluation with no result resets a pending `for:`)"


# An instant vector selector sees a series' newest sample within the lookback window before the
# evaluation time: 5m by default (prometheus/prometheus@v3.5.5 cmd/prometheus/main.go,
# --query.lookback-delta, default "5m"; kilonode's Prometheus does not set it), and since v3 the window
# is left-open (docs/migration.md:79-91, "Range selectors and lookback exclude samples coinciding with
# the left boundary"). A job scraped every 5m or less often therefore has evaluations where its newest
# sample is 5m old or older, on any late scrape (or always, past 5m): the series is absent from the
# alert's result there, and an alert that drops out of its result loses its pending `for:`
# (rules/alerting.go AlertingRule.Eval: a pending alert no longer in the result is deleted from the
# active set, a firing one resolves).
LOOKBACK_S = 300.0
_INSTANT = re.compile(r"(?<![\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{[^}]*\})(?!\s*\[[^\]:]*\])")


def _stale_reads(expr: str, intervals: Mapping[str, float]) -> set[tuple[str, float]]:
    """(job, interval) for each instant selector in `expr` (not under a range; a subquery's inner
    selector is read as an instant vector at each step) naming a job scraped at or past the lookback."""
    found = set()
    for _, matchers in _INSTANT.findall(expr):
        for op, value in _JOB_MATCHER.findall(matchers):
            jobs = [value] if op == "=" else [j for j in intervals if _fullmatch(value, j)]
            for job in jobs:
                interval = intervals.get(job)
                if interval and interval >= LOOKBACK_S:
                    found.add((job, interval))
    return found


def stale_instant_reads(entry: Mapping[str, Any] | None) -> dict[str, set[tuple[str, float]]]:
    """alert name -> (job, interval) of the instant vectors it reads, itself or through recording rules
    (a recording rule that drops out leaves its series absent too), of jobs scraped at or past 5m."""
    intervals = scrape_intervals(entry)
    if not intervals:
        return {}
    return _per_alert(alert_rules(entry), lambda expr: _stale_reads(expr, intervals))


def lookback_gaps(diff: StackDiff) -> list[Finding]:
    """Alerts that newly read, as an instant vector, a job scraped at or past the 5m lookback."""
    before, after = stale_instant_reads(diff.base), stale_instant_reads(diff.head)
    groups: dict[tuple[str, float], set[str]] = {}
    for alert, reads in after.items():
        for job, interval in reads - before.get(alert, set()):
            groups.setdefault((job, interval), set()).add(alert)
    return [Finding(MEDIUM, "scrape-past-lookback", (
        f"job {job} is scraped every {interval:g}s, at or past Prometheus's {LOOKBACK_S:g}s lookback (the "
        "default --query.lookback-delta; since v3 the window is open at its older end, docs/migration.md), and "
        f"{', '.join(sorted(alerts))} read its series as an instant vector: at any evaluation whose newest sample "
        "is 5m old or older (a late scrape" + (", and every cycle at this interval" if interval > LOOKBACK_S else "")
        + ") the series is absent, the alert drops out of the result: pending, its `for:` starts again; firing, it "
        "resolves. So it fires late or never, or flaps. Scrape the job more often than every 5m (under 2.5m "
        "leaves a missed scrape's margin), or "
        "read it through last_over_time(...[interval x 2]) in the rule"),
        tuple(sorted(alerts)), cause=f"job {job} past lookback")
        for (job, interval), alerts in sorted(groups.items())]


# dcgm-exporter watches only the fields its collectors file names, each published under the field's own
# name (NVIDIA/dcgm-exporter 4.5.3-4.8.2, pkg/cmd/app.go l.123-149: -f / DCGM_EXPORTER_COLLECTORS, the
# counters CSV "DCGM FIELD, Prometheus metric type, help message", etc/default-counters.csv's format):
# a field gone from the file is a series gone from every GPU node, whatever the scrape keeps.
_DCGM_IMAGE = "dcgm-exporter"
_DCGM_PREFIX = "DCGM_FI_"


@functools.cache
def _image_default_counters() -> tuple[str, frozenset[str]]:
    """The image's own counters file: its path and the fields its uncommented lines name
    (catalog/dcgm_default_counters.yaml, read from NVIDIA/dcgm-exporter etc/default-counters.csv at the pinned tag)."""
    data = yaml.safe_load((CATALOG_DIR / "dcgm_default_counters.yaml").read_text())
    return str(data["path"]), frozenset(str(f) for f in data["fields"])


class CountersFile(NamedTuple):
    path: str  # the file the container reads
    origin: str  # "ConfigMap <name>" or "the image's default"
    fields: frozenset[str]


def _collectors_path(container: Mapping[str, Any]) -> str:
    """The collectors file dcgm-exporter reads: -f / --collectors on its command line, else the
    DCGM_EXPORTER_COLLECTORS env, else the flag's default (urfave/cli v2: a flag given on the command line
    wins over its EnvVars; NVIDIA/dcgm-exporter 4.5.3-4.8.2 pkg/cmd/app.go l.123-129)."""
    default, _ = _image_default_counters()
    path = default
    for env in container.get("env") or []:
        if env.get("name") == "DCGM_EXPORTER_COLLECTORS" and env.get("value") is not None:
            path = str(env["value"])
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name.lstrip("-") in ("f", "collectors") and name.startswith("-"):
            if eq:
                path = value
            elif i + 1 < len(words):
                path = words[i + 1]
    return path


def dcgm_counters(pod: Mapping[str, Any], maps: Mapping[str, Mapping[str, Any]]) -> CountersFile | None:
    """The counters file dcgm-exporter's container of this pod reads and the fields it names, following the
    path through the container's ConfigMap mounts (a key of the mounted ConfigMap, items and subPath
    followed); the image's own default-counters.csv where no mount covers the path. None where the file is
    neither (a path kilonode cannot read: not judged)."""
    containers = [c for c in pod.get("containers") or [] if _DCGM_IMAGE in str(c.get("image") or "")]
    if not containers:
        return None
    container = containers[0]
    path = os.path.normpath(_collectors_path(container))
    volumes = {str(v.get("name")): v for v in pod.get("volumes") or []}
    for mount in sorted(container.get("volumeMounts") or [], key=lambda m: -len(str(m.get("mountPath")))):
        at = os.path.normpath(str(mount.get("mountPath")))
        sub = mount.get("subPath")
        if path != at and not (not sub and path.startswith(at.rstrip("/") + "/")):
            continue
        source = (volumes.get(str(mount.get("name"))) or {}).get("configMap")
        if not source:
            return None  # another volume covers the path: its content is not in the record
        name = str(source.get("name"))
        rel = str(sub) if sub else path[len(at.rstrip("/")) + 1:]
        items = source.get("items")
        key = next((str(i.get("key")) for i in items if str(i.get("path")) == rel), None) if items else rel
        text = (maps.get(name) or {}).get(key) if key else None
        if text is None:
            return None
        fields = {line.split(",", 1)[0].strip() for line in str(text).splitlines()}
        return CountersFile(path, f"ConfigMap {name}", frozenset(f for f in fields if f.startswith(_DCGM_PREFIX)))
    default, fields = _image_default_counters()
    return CountersFile(path, "the image's default", fields) if path == default else None


def _dcgm_files(entry: Mapping[str, Any] | None) -> list[CountersFile | None]:
    resources = [r for r in (entry or {}).get("resources") or [] if isinstance(r, Mapping)]
    maps = {str(((r.get("inputs") or {}).get("metadata") or {}).get("name")): (r.get("inputs") or {}).get("data") or {}
            for r in resources if r.get("type") == "kubernetes:core/v1:ConfigMap"}
    found = []
    for r in resources:
        if r.get("type") != "kubernetes:apps/v1:DaemonSet":
            continue
        pod = ((((r.get("inputs") or {}).get("spec") or {}).get("template") or {}).get("spec") or {})
        if any(_DCGM_IMAGE in str(c.get("image") or "") for c in pod.get("containers") or []):
            found.append(dcgm_counters(pod, maps))
    return found


def exporter_fields(entry: Mapping[str, Any] | None) -> dict[str, set[str]] | None:
    """exporter -> the metric names its own configuration makes it publish, for the exporters whose set is a
    file kilonode can read (dcgm-exporter's counters CSV: the file its -f / DCGM_EXPORTER_COLLECTORS names,
    from the ConfigMap mounted there or, at the image's own path, the image's default-counters.csv); None
    where the side has no such exporter or its file is one kilonode cannot read."""
    files = _dcgm_files(entry)
    if not files or any(f is None for f in files):
        return None
    return {_DCGM_IMAGE: set().union(*(f.fields for f in files if f is not None))}


def unexported_reads(entry: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """alert name -> {metric it reads (through recording rules) -> the exporter whose own set lacks it}."""
    sets = exporter_fields(entry)
    if not sets or not sets.get(_DCGM_IMAGE):
        return {}
    exported = sets[_DCGM_IMAGE]
    found: dict[str, dict[str, str]] = {}
    for alert, metrics in _per_alert(alert_rules(entry), lambda expr: set(metric_names(expr))).items():
        for metric in metrics:
            if metric.startswith(_DCGM_PREFIX) and metric not in exported:
                found.setdefault(alert, {})[metric] = _DCGM_IMAGE
    return found


def _pages(rules: list[Mapping[str, Any]], alerts: set[str]) -> bool:
    """Whether one of the alerts is a paging one (severity critical: kilonode.render.alertmanager routes
    `severity="critical"` to the page receiver, every alert to the notify one)."""
    return any(_severity(r)[1] == "critical" for r in rules if str(r.get("alert")) in alerts)


def dropped(diff: StackDiff) -> list[Finding]:
    """Alerts that read a metric the head's scrape config newly drops, or that its exporter's own
    configuration (dcgm-exporter's counters file) newly no longer publishes."""
    before, after = dropped_reads(diff.base), dropped_reads(diff.head)
    groups: dict[tuple[str, str], list[str]] = {}
    for alert, metrics in after.items():
        for metric, jobs in metrics.items():
            if metric not in before.get(alert, {}):
                groups.setdefault((metric, ", ".join(sorted(jobs))), []).append(alert)
    return _relabel_dropped(groups) + _unexported(diff, {m for m, _ in groups})


def _unexported(diff: StackDiff, relabelled: set[str]) -> list[Finding]:
    """metric-dropped for a metric gone from the exporter's configured set (base had it, head does not)."""
    before, after = unexported_reads(diff.base), unexported_reads(diff.head)
    gone: dict[str, set[str]] = {}
    for alert, metrics in after.items():
        for metric in metrics:
            if metric not in before.get(alert, {}):
                gone.setdefault(metric, set()).add(alert)
    by_alerts: dict[tuple[str, ...], list[str]] = {}
    for metric, alerts in gone.items():
        by_alerts.setdefault(tuple(sorted(alerts)), []).append(metric)
    rules = alert_rules(diff.head)
    found = []
    for alerts, metrics in sorted(by_alerts.items()):
        pages = _pages(rules, set(alerts))
        also = sorted(set(metrics) & relabelled)
        found.append(Finding(HIGH if pages else MEDIUM, "metric-dropped", (
            f"{', '.join(sorted(metrics))} no longer exported: {_counters_said(diff)} no longer names "
            + ("it" if len(metrics) == 1 else "them") + ", and dcgm-exporter watches and publishes only the fields "
            "that file names (NVIDIA/dcgm-exporter pkg/cmd/app.go l.123-149, the pinned release), so the series go "
            "from every GPU node" + (f" (the scrape's keep list drops {', '.join(also)} as well)" if also else "")
            + f". The alert rules read them: {_said({_severity(r) for r in rules if str(r.get('alert')) in alerts})} "
            "can no longer fire on them (the expression returns nothing; promtool checks the rules alone and "
            "passes)" + (", and it pages" if pages else " (not a paging alert: severity warning)") + ". Keep "
            "the fields in the counters file, or remove or rewrite the alert in the same change"),
            alerts, cause=f"{sorted(metrics)[0]} unexported"))
    return found


def _counters_said(diff: StackDiff) -> str:
    """Which file the head's dcgm-exporter reads, said against the base's."""
    base = {(f.path, f.origin) for f in _dcgm_files(diff.base) if f is not None}
    head = {(f.path, f.origin) for f in _dcgm_files(diff.head) if f is not None}
    said = ", ".join(f"{path} ({origin})" for path, origin in sorted(head))
    if head == base:
        return f"dcgm-exporter's counters file, {said},"
    was = ", ".join(f"{path} ({origin})" for path, origin in sorted(base - head))
    default = any(origin == "the image's default" for _, origin in head)
    return (f"dcgm-exporter's collectors file (-f / DCGM_EXPORTER_COLLECTORS) now points at {said} instead of "
            f"{was}" + (": the image's own etc/default-counters.csv, whose enabled fields (catalog/"
                        "dcgm_default_counters.yaml, NVIDIA/dcgm-exporter as pinned) are not kilonode's; that file"
                        if default else ", which"))


# DCGM's profiling fields (DCGM_FI_PROF_*) are collected through DCGM's profiling module, which holds the GPU's
# performance counters while watched: NVIDIA's DCGM docs, "dcgmi profile" (reference/command-line-reference/
# dcgmi/dcgmi-profile.html): pausing "releases profiling resources so developer tools such as Nsight Compute or
# Nsight Systems can use them"; a CUPTI-based profiler started while DCGM watches them fails (NVIDIA/DCGM
# issue 56, "the third-party profiling module returned an unrecoverable error", the same contention seen from
# DCGM's side).
_PROF_PREFIX = "DCGM_FI_PROF_"


def profiling_held(diff: StackDiff) -> list[Finding]:
    """dcgm-profiling-held (medium): the head's dcgm-exporter newly watches a DCGM_FI_PROF_* field."""
    before, after = exporter_fields(diff.base), exporter_fields(diff.head)
    if after is None:
        return []
    old = {f for f in (before or {}).get(_DCGM_IMAGE, set()) if f.startswith(_PROF_PREFIX)}
    new = sorted(f for f in after.get(_DCGM_IMAGE, set()) if f.startswith(_PROF_PREFIX) and f not in old)
    if not new or (before is None and _dcgm_files(diff.base)):
        return []  # the base's file is one kilonode cannot read: whether they are new is not known
    return [Finding(MEDIUM, "dcgm-profiling-held", (
        f"dcgm-exporter now watches DCGM's profiling fields ({', '.join(new)}; {_counters_said(diff)} names "
        "them): DCGM collects them through its profiling module, which holds each GPU's performance counters "
        "while they are watched, so users' Nsight Compute, Nsight Systems and other CUPTI profilers fail on every "
        "GPU node where dcgm-exporter runs until it is paused (`dcgmi profile --pause`; NVIDIA DCGM docs, "
        "dcgmi profile: pausing \"releases profiling resources so developer tools such as Nsight Compute or "
        "Nsight Systems can use them\"). Keep DCGM_FI_PROF_* out of the counters file unless profiling on these "
        "nodes is given up, or document the pause"),
        (), cause="DCGM_FI_PROF_* watched")]


def _relabel_dropped(groups: Mapping[tuple[str, str], list[str]]) -> list[Finding]:
    return [Finding(HIGH, "metric-dropped", (
        f"{metric} is dropped before ingestion by the metric_relabel_configs of {jobs} (action drop or keep on "
        f"__name__), and the alert rules read it: {', '.join(sorted(set(alerts)))} can never fire on it (the "
        "series never exist, so the expression returns nothing; promtool checks the rules alone and passes). "
        "Keep the metric (take it out of the drop list) or rewrite those rules on what is kept"),
        tuple(sorted(set(alerts))), cause=f"{metric} dropped")
        for (metric, jobs), alerts in sorted(groups.items())]


def unrecorded_reads(entry: Mapping[str, Any] | None) -> dict[str, set[str]]:
    """alert name -> the recorded-style names (a ':' in them: Prometheus' recording-rule naming,
    docs/practices/rules.md, level:metric:operations) it reads, itself or through the recording rules it
    follows, that no recording rule of the side records."""
    rules = alert_rules(entry)
    records = _records(rules)
    return _per_alert(rules, lambda expr: {name for name in metric_names(expr)
                                           if ":" in name and name not in records})


def records_missing(diff: StackDiff) -> list[Finding]:
    """Alerts that at the head read a recorded name no recording rule records any more (it was recorded at
    the base): a renamed or removed recording rule left behind by its alerts."""
    base_records = _records(alert_rules(diff.base))
    head_records = _records(alert_rules(diff.head))
    groups: dict[str, set[str]] = {}
    for alert, names in unrecorded_reads(diff.head).items():
        for name in names:
            if name in base_records:
                groups.setdefault(name, set()).add(alert)
    found = []
    for name, alerts in sorted(groups.items()):
        # the same expressions recorded under a name the base did not have: a rename, said as one
        renamed = sorted(other for other, exprs in head_records.items()
                         if other not in base_records and sorted(exprs) == sorted(base_records[name]))
        instead = (f" (the head records the same expression{'s' if len(base_records[name]) > 1 else ''} as "
                   f"{', '.join(renamed)}: a rename the alerts did not follow)") if renamed else ""
        found.append(Finding(HIGH, "recording-rule-missing", (
            f"{name} is no longer recorded by any recording rule{instead}, and {', '.join(sorted(alerts))} still "
            f"read{'s' if len(alerts) == 1 else ''} it: a name with ':' is a recording rule's (Prometheus "
            "docs/practices/rules.md, level:metric:operations), which no job scrapes, so from the reload on the "
            "series is never written again, the expression returns nothing after the lookback, and the alerts can "
            "never fire (promtool checks each rule alone and passes). Rename the alerts' reads with the record, or "
            "keep the old record"), tuple(sorted(alerts)), cause=f"{name} not recorded"))
    return found


def syntax_only(promtool: Path) -> bool:
    """Whether this promtool's `check config` has --syntax-only (2.33+)."""
    try:
        done = subprocess.run([str(promtool), "check", "config", "--help"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--syntax-only" in done.stdout + done.stderr


def check_config(promtool: Path, data: Mapping[str, str], key: str, only_syntax: bool,
                 set_aside: frozenset[str] = frozenset()) -> str | None:
    """promtool's complaint about the configuration `key` of a ConfigMap whose keys are laid out as its
    volume shows them, or None when it accepts it; `set_aside`: discoveries whose blocks are taken out first."""
    with tempfile.TemporaryDirectory(prefix="kilonode-config-") as tmp:
        for name, text in data.items():
            # a ConfigMap key is a file name ([-._a-zA-Z0-9]+, not . or ..); anything else stays out
            if re.fullmatch(r"[-._a-zA-Z0-9]+", name) and name not in (".", ".."):
                (Path(tmp) / name).write_text(_without(text, set_aside) if name == key else text, encoding="utf-8")
        path = Path(tmp) / key
        done = subprocess.run([str(promtool), "check", "config", *(["--syntax-only"] if only_syntax else []),
                               str(path)], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    if done.returncode == 0:
        return None
    lines = [line.strip().replace(str(path), key) for line in (done.stdout + done.stderr).splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith("Checking")) or f"exit {done.returncode}"


def _without(text: str, discoveries: frozenset[str]) -> str:
    """The configuration with its `<discovery>_sd_configs` blocks (scrape jobs and Alertmanagers) taken out."""
    config = _load(text) if discoveries else None
    if not isinstance(config, dict):
        return text
    fields = {f"{name}_sd_configs" for name in discoveries}
    alertmanagers = (config.get("alerting") or {}).get("alertmanagers") if isinstance(config.get("alerting"),
                                                                                      dict) else None
    for block in [*(config.get("scrape_configs") or []), *(alertmanagers or [])]:
        if isinstance(block, dict):
            for field in fields:
                block.pop(field, None)
    return yaml.safe_dump(config, sort_keys=False)


def judge_config(promtool: Path, data: Mapping[str, str], key: str, only_syntax: bool
                 ) -> tuple[str | None, frozenset[str]]:
    """promtool's complaint (None: accepted), with the blocks of any discovery it was built without (one the
    pinned server has) set aside, and which were."""
    problem = check_config(promtool, data, key, only_syntax)
    unbuilt = frozenset(_UNBUILT.findall(problem or "")) & DISCOVERIES
    if not unbuilt:
        return problem, frozenset()
    problem = check_config(promtool, data, key, only_syntax, unbuilt)
    # the line numbers would be the rewritten file's, not the ConfigMap's: left out
    return (re.sub(r"\bline \d+: ", "", problem) if problem else None), unbuilt


def _jobs(text: str | None) -> dict[str, Any]:
    config = _load(text)
    jobs = config.get("scrape_configs") if isinstance(config, Mapping) else None
    return {str(j.get("job_name")): j for j in jobs or [] if isinstance(j, Mapping)}


def configs_rejected(diff: StackDiff, promtool: Path, changed: Mapping[str, tuple[dict[str, str], str]],
                     version: str, server: str) -> list[Finding]:
    """The head's Prometheus configurations, where the change alters them, that promtool rejects and the
    base's it accepts."""
    before = prometheus_configs(diff.base)
    only_syntax = syntax_only(promtool)
    found = []
    for label, (data, key) in sorted(changed.items()):
        problem, aside = judge_config(promtool, data, key, only_syntax)
        if problem is None:
            continue
        if label in before:
            base_problem, _ = judge_config(promtool, *before[label], only_syntax)
            if base_problem is not None:
                diff.note(f"{label}: {version} rejects the base's Prometheus configuration too ({base_problem}), so "
                          f"the change to it is not judged (the cluster runs {server})")
                continue
        # the job promtool names, else the jobs the change alters (a problem outside any job names none)
        base_data, base_key = before.get(label, ({}, key))
        old_jobs, new_jobs = _jobs(base_data.get(base_key)), _jobs(data[key])
        jobs = _JOB_NAMED.findall(problem) or sorted(j for j in new_jobs if new_jobs[j] != old_jobs.get(j))
        named = f"job {', '.join(jobs)}" if jobs else "the configuration"
        set_aside = (f" (checked with its {', '.join(f'{d}_sd_configs' for d in sorted(aside))} blocks set aside: "
                     f"this promtool is built without that discovery)") if aside else ""
        found.append(Finding(HIGH, "scrape-config-rejected", (
            f"{label}: {version} rejects the Prometheus configuration, {named} ({problem}){set_aside}. Prometheus "
            "refuses the reload and keeps running the old configuration, saying so only in "
            "prometheus_config_last_reload_successful and its log; at its next start (any new pod: a reimage, an "
            f"eviction, a template change) it exits before it scrapes anything: alerting is gone ({CONFIG_SOURCE}). "
            f"Checked with {version}; the cluster runs {server}. Fix {named}, and run `promtool check config "
            "--syntax-only` on it before merging"), (label,)))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    if not any(c.type == CONFIG_MAP for c in diff.resources):
        # no ConfigMap changed: no rule file or Prometheus configuration did; an exporter's pod template may
        # still point it at another fields file (dcgm-exporter's -f / DCGM_EXPORTER_COLLECTORS, trace 18 PR 4)
        if not any(c.type == "kubernetes:apps/v1:DaemonSet" for c in diff.resources):
            return []
        return [*_unexported(diff, set()), *profiling_held(diff)]
    found = [*dropped(diff), *profiling_held(diff), *records_missing(diff), *ranges_too_short(diff),
             *lookback_gaps(diff), *jobs_unselected(diff), *scrape_limits_below_load(diff)]
    before, after = rule_files(diff.base), rule_files(diff.head)
    changed = {key: text for key, text in after.items() if before.get(key) != text}
    base_configs = {label: data[key] for label, (data, key) in prometheus_configs(diff.base).items()}
    configs = {label: (data, key) for label, (data, key) in prometheus_configs(diff.head).items()
               if base_configs.get(label) != data[key]}
    if not changed and not configs:
        return _unread(diff, found)
    promtool = locate()
    if promtool is None:
        where = f"(put it on PATH or name it in ${PROMTOOL_ENV}; `make test-artefacts` unpacks Debian's)"
        if changed:
            diff.note(f"alert rules ({', '.join(sorted(changed))}) changed and were not checked: no promtool here "
                      + where)
        if configs:
            diff.note(f"the Prometheus configuration ({', '.join(sorted(configs))}) changed and was not checked: no "
                      "promtool here " + where)
        return _unread(diff, found)
    version = _version(promtool)
    server = (plan_of(diff.head).get("components") or {}).get("prometheusImage") or "the pinned Prometheus"
    found += configs_rejected(diff, promtool, configs, version, server)
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
    return _unread(diff, found)


def _unread(diff: StackDiff, found: list[Finding]) -> list[Finding]:
    """Say each head rule whose PromQL the parser could not read, unless promtool rejected a rule file
    (alert-rules-rejected says that file is refused whole: a rule it cannot parse is the cause)."""
    if not any(f.rule == "alert-rules-rejected" for f in found):
        for (kind, name), why in sorted(unreadable(diff.head).items()):
            diff.note(f"{'recording rule' if kind == 'record' else 'alert'} {name}: its PromQL was not read by "
                      f"promql_parser ({why}), so metric-dropped, recording-rule-missing and alert-selects-no-job "
                      "did not judge what it selects")
    return found


# --- alert-selects-no-job -------------------------------------------------------------------------------------
# A seventh rule (`alert-selects-no-job`, high), from an eighth independent trace on research-7500: the rules'
# selector `job="kilonode-apiserver"` changed to the kube-prometheus mixin's `job="apiserver"`. A series' job
# label is its scrape config's job_name unless the target's own labels set one (prometheus/prometheus@v3.5.5
# scrape/target.go:444-456, PopulateDiscoveredLabels: `job` set from cfg.JobName only where lb.Get(job) is
# empty), then relabel_configs (target.go:461), metric_relabel_configs and, with honor_labels, the scraped
# labels (scrape/scrape.go:670-692, mutateSampleLabels) may rewrite it. A matcher naming a job no scrape gives
# selects nothing (`=` compares the value; `=~` is anchored, model/labels/regexp.go:70, "^(?s:" + re + ")$"),
# the rule returns nothing, and promtool, which checks the rules alone, passes it. The selectors are read from
# promql_parser's syntax tree (`scan`, below; the module docstring says why that library).

class PromQLSyntax(ValueError):
    """An expression promql_parser does not read: one Prometheus rejects too (promtool says so:
    alert-rules-rejected), or one of the library's gaps the module docstring lists; `unreadable` says which rules."""


# A selector with a lone quoted name, `{"name"}`, is `{__name__="name"}` in Prometheus' tree
# (prometheus/prometheus@v3.5.5 promql/parser/generated_parser.y:676, parse.go:952-959 newMetricNameMatcher) and in
# promql_parser's: its metric is that matcher's value.
_METRIC_LABEL = "__name__"
_MATCH_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
# The library's tree costs time and memory quadratic in its depth, and its recursion overflows the native stack at
# a few thousand levels (measured with 0.12.0: 1,000 nested `x+(...)` take 0.65 s and 460 MB to parse, 2,800 segfault
# on an 8 MiB stack). So a longer expression than MAX_EXPR_CHARS is not parsed (noted, like a parse error: the
# shipped rules' longest is 645), which bounds the depth; the worst shape measured at the bound (2,040 unary minus)
# takes about 1 s and 380 MB. The parse runs on a thread with its own stack, whatever the process' stack limit is.
MAX_EXPR_CHARS = 2048
_PARSE_STACK_BYTES = 64 << 20
# Series whose job label is not a scrape's: an alert's own labels (rules/alerting.go ALERTS, ALERTS_FOR_STATE).
_NOT_SCRAPED = frozenset({"ALERTS", "ALERTS_FOR_STATE"})
ABSENT = frozenset({"absent", "absent_over_time"})


class Selector(NamedTuple):
    metric: str  # '' for `{...}` without a name
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value), the value unquoted
    within: tuple[str, ...]  # the calls (functions, aggregations) it sits in, outermost first


def _walk(tree: promql_parser.Expr) -> tuple[tuple[Selector, ...], frozenset[str]]:
    """The selectors of a parsed expression, in the order they are written, and the functions and aggregations it
    calls. Iterative: a deep tree does not reach Python's recursion limit."""
    found: list[Selector] = []
    calls: set[str] = set()
    todo: list[tuple[Any, tuple[str, ...]]] = [(tree, ())]
    while todo:
        node, within = todo.pop()
        if isinstance(node, promql_parser.VectorSelector):
            # `{a="b" or c="d"}`, a GreptimeDB extension Prometheus rejects, holds its groups in or_matchers
            for group in node.matchers.or_matchers or [node.matchers.matchers]:
                matchers = [(m.name, _MATCH_OPS[str(m.op)], m.value) for m in group]
                metric = node.name or ""
                named = next((m for m in matchers if m[0] == _METRIC_LABEL and m[1] == "="), None)
                if not metric and named:
                    metric = named[2]
                    matchers.remove(named)
                found.append(Selector(metric, tuple(matchers), within))
        elif isinstance(node, promql_parser.MatrixSelector):
            todo.append((node.vector_selector, within))
        elif isinstance(node, promql_parser.Call):
            calls.add(node.func.name)
            todo += [(arg, (*within, node.func.name)) for arg in reversed(node.args)]
        elif isinstance(node, promql_parser.AggregateExpr):
            op = str(node.op).lower()
            calls.add(op)
            todo += [(node.expr, (*within, op))] + ([(node.param, (*within, op))] if node.param is not None else [])
        elif isinstance(node, promql_parser.BinaryExpr):
            todo += [(node.rhs, within), (node.lhs, within)]
        elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
            todo.append((node.expr, within))
    return tuple(found), frozenset(calls)


_STACK_SIZE_LOCK = threading.Lock()  # threading.stack_size is process-wide: one parse thread set up at a time


@functools.lru_cache(maxsize=1024)
def _read(expr: str) -> tuple[tuple[Selector, ...], frozenset[str]] | str:
    """`_walk` of the parsed expression, or why it was not read (the parse on its own thread: MAX_EXPR_CHARS)."""
    if len(expr) > MAX_EXPR_CHARS:
        return f"{len(expr)} characters, over the {MAX_EXPR_CHARS} this review parses"
    outcome: list[tuple[tuple[Selector, ...], frozenset[str]] | str] = []

    def work() -> None:
        try:
            outcome.append(_walk(promql_parser.parse(expr)))
        except BaseException as e:  # a Rust panic arrives as PanicException, a BaseException; no signal reaches here
            outcome.append(str(e).strip() or type(e).__name__)

    on_parse_thread(work)
    return outcome[0] if outcome else "the parser stopped without a result"


def on_parse_thread(work: Callable[[], None], name: str = "kilonode-promql") -> None:
    """Run `work` (a promql_parser call) on its own thread with _PARSE_STACK_BYTES of stack, and wait for
    it: the parser recurses deeply (MAX_EXPR_CHARS says why), and the process's main stack may be small."""
    with _STACK_SIZE_LOCK:
        previous = threading.stack_size(_PARSE_STACK_BYTES)
        try:
            worker = threading.Thread(target=work, name=name, daemon=True)
            worker.start()
        finally:
            threading.stack_size(previous)
    worker.join()


def scan(expr: str) -> tuple[list[Selector], set[str]]:
    """Every vector selector of a PromQL expression, `metric{...}`, `{...}` and a bare `metric` (also under a range
    or in a subquery), with its matchers and the calls it sits in; and the functions and aggregations it calls. Raises
    PromQLSyntax where promql_parser does not read it."""
    read = _read(expr)
    if isinstance(read, str):
        raise PromQLSyntax(read)
    return list(read[0]), set(read[1])


def selectors(expr: str) -> list[Selector]:
    return scan(expr)[0]


def unreadable(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], str]:
    """(rule kind, name) -> why its expression was not read, for the side's rules promql_parser does not parse: the
    readers here skip them, so the review says so."""
    found = {}
    for rule in alert_rules(entry):
        read = _read(str(rule["expr"]))
        if isinstance(read, str):
            found[_rule_key(rule)] = read
    return found


def scrape_jobs(entry: Mapping[str, Any] | None) -> tuple[set[str], set[str]]:
    """(the job label values the side's scrapes give their series, the scrape jobs whose job label is set at scrape
    time to values no configuration names). Each job_name, except where every static group's labels set `job`
    (then those); a relabelling to `job` adds its literal replacement; one from a captured value (`$1`), a labelmap,
    honor_labels, or file or HTTP discovery (their targets carry labels) leaves the job open."""
    values: set[str] = set()
    open_jobs: set[str] = set()
    for config in _deployed_scrape_documents(entry):
        for job in config["scrape_configs"]:
            if not isinstance(job, Mapping) or not job.get("job_name"):
                continue
            name = str(job["job_name"])
            groups = [g for g in job.get("static_configs") or [] if isinstance(g, Mapping)]
            set_by_group = [str((g.get("labels") or {}).get("job") or "") for g in groups]
            others = any(k.endswith("_sd_configs") for k in job)
            values |= {v or name for v in set_by_group} if groups and not others else {name}
            if others and any(v for v in set_by_group):
                values |= {v for v in set_by_group if v}
            if job.get("honor_labels") or job.get("file_sd_configs") or job.get("http_sd_configs"):
                open_jobs.add(name)
            for relabel in [*(job.get("relabel_configs") or []), *(job.get("metric_relabel_configs") or [])]:
                if not isinstance(relabel, Mapping):
                    continue
                action = str(relabel.get("action") or "replace").lower()
                target = str(relabel.get("target_label") or "")
                replacement = str(relabel.get("replacement", "$1"))
                if action == "labelmap" or (action == "replace" and "$" in target):
                    open_jobs.add(name)
                elif action == "replace" and target == "job":
                    if "$" in replacement:
                        open_jobs.add(name)
                    elif replacement:
                        values.add(replacement)
    return values, open_jobs


def _names_no_job(op: str, value: str, jobs: set[str]) -> bool:
    """Whether a job matcher (`=` or `=~`) selects none of `jobs` and does not select the series without a job."""
    if op == "=":
        return value != "" and value not in jobs
    try:
        regex = re.compile(value, re.DOTALL)
    except re.error:
        return False  # promtool rejects it (alert-rules-rejected), or RE2 syntax Python lacks: not judged
    return regex.fullmatch("") is None and not any(regex.fullmatch(j) for j in jobs)


def _rule_key(rule: Mapping[str, Any]) -> tuple[str, str]:
    """("record", name) or ("alert", name): the same rule on both sides (a name may have several definitions)."""
    return ("record", str(rule["record"])) if rule.get("record") else ("alert", str(rule.get("alert")))


def blind_selectors(entry: Mapping[str, Any] | None
                    ) -> tuple[dict[tuple[tuple[str, str], str], set[str]], set[str]]:
    """({(rule, job matcher as written) -> the metrics it selects} for every job matcher of the side's rules that
    names no job the side's scrapes give, the open scrape jobs). A selector of a name the side's rules record is held
    to those jobs and the records' own `labels: {job: ...}` (rules/recording.go Eval sets them), and not judged
    where a record's expression rewrites labels (label_replace, label_join); one of a recorded-style name no rule
    records is recording-rule-missing's; ALERTS carries alerts' labels."""
    jobs, open_jobs = scrape_jobs(entry)
    if not jobs or open_jobs:
        return {}, open_jobs
    rules = alert_rules(entry)
    recorded: dict[str, set[str]] = {}
    rewritten: set[str] = set()
    for rule in rules:
        if rule.get("record"):
            name = str(rule["record"])
            labels = rule.get("labels") if isinstance(rule.get("labels"), Mapping) else {}
            recorded.setdefault(name, set()).update({str(labels["job"])} if labels.get("job") else set())
            try:
                if scan(str(rule["expr"]))[1] & {"label_replace", "label_join"}:
                    rewritten.add(name)
            except PromQLSyntax:
                rewritten.add(name)
    found: dict[tuple[tuple[str, str], str], set[str]] = {}
    for rule in rules:
        try:
            read = selectors(str(rule["expr"]))
        except PromQLSyntax:
            continue  # promtool rejects it: alert-rules-rejected
        for selector in read:
            if selector.metric in _NOT_SCRAPED or selector.metric in rewritten or (
                    ":" in selector.metric and selector.metric not in recorded):
                continue
            known = jobs | recorded.get(selector.metric, set())
            for label, op, value in selector.matchers:
                if label == "job" and op in ("=", "=~") and _names_no_job(op, value, known):
                    found.setdefault((_rule_key(rule), f'job{op}"{value}"'), set()).add(selector.metric or "{...}")
    return found, open_jobs


def _severity(rule: Mapping[str, Any]) -> tuple[str, str]:
    labels = rule.get("labels") if isinstance(rule.get("labels"), Mapping) else {}
    return str(rule.get("alert")), str(labels.get("severity") or "")


def _readers(rules: list[Mapping[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    """recorded name -> the alerting rules, (alert, severity), that read it, themselves or through other recording
    rules (by the selectors)."""
    records = _records(rules)
    reads: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        try:
            names = {s.metric for s in selectors(str(rule["expr"]))} & set(records)
        except PromQLSyntax:
            continue
        reads.setdefault(_rule_key(rule), set()).update(names)
    found: dict[str, set[tuple[str, str]]] = {}
    for rule in rules:
        if not rule.get("alert"):
            continue
        seen: set[str] = set()
        todo = list(reads.get(_rule_key(rule), set()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += reads.get(("record", name), set())
        for name in seen:
            found.setdefault(name, set()).add(_severity(rule))
    return found


def _reading(rules: list[Mapping[str, Any]], matcher: str, absent: bool) -> set[tuple[str, str]]:
    """The alerting rules whose own expression has the matcher: inside absent() or absent_over_time() (which return a
    series exactly when their argument is empty, promql/functions.go funcAbsent: those fire at every evaluation
    instead), or (absent=False) anywhere."""
    found = set()
    for rule in rules:
        if not rule.get("alert"):
            continue
        try:
            read = selectors(str(rule["expr"]))
        except PromQLSyntax:
            continue
        if any((not absent or set(s.within) & ABSENT) and any(f'{k}{o}"{v}"' == matcher for k, o, v in s.matchers)
               for s in read):
            found.add(_severity(rule))
    return found


def _said(alerts: set[tuple[str, str]]) -> str:
    """"A (warning, critical), B": each alert name once, with the severities of its rules that are meant."""
    by: dict[str, set[str]] = {}
    for name, severity in alerts:
        by.setdefault(name, set()).update({severity} if severity else set())
    order = {"critical": 0, "warning": 1}
    return ", ".join(f"{name} ({', '.join(sorted(sev, key=lambda s: (order.get(s, 2), s)))})" if sev else name
                     for name, sev in sorted(by.items()))


def jobs_unselected(diff: StackDiff) -> list[Finding]:
    """Rules whose job matcher names, at the head, no job the head's Prometheus scrapes, where the base's same rule's
    same matcher named one (or the base had no such rule): the rule returns nothing; its alerts never fire."""
    after, open_jobs = blind_selectors(diff.head)
    if open_jobs:
        diff.note(f"the rules' job selectors were not judged: scrape job{'s' if len(open_jobs) > 1 else ''} "
                  f"{', '.join(sorted(open_jobs))} set{'' if len(open_jobs) > 1 else 's'} the job label at scrape "
                  "time (honor_labels, file or HTTP discovery, a labelmap or a relabelling from a captured value)")
        return []
    before, _ = blind_selectors(diff.base)
    groups: dict[str, dict[tuple[str, str], set[str]]] = {}
    for (rule, matcher), metrics in after.items():
        if (rule, matcher) not in before:
            groups.setdefault(matcher, {}).setdefault(rule, set()).update(metrics)
    if not groups:
        return []
    rules = alert_rules(diff.head)
    readers = _readers(rules)
    jobs, _ = scrape_jobs(diff.head)
    found = []
    for matcher, by_rule in sorted(groups.items()):
        alerts: set[tuple[str, str]] = set()
        for kind, name in by_rule:
            alerts |= readers.get(name, set()) if kind == "record" else {
                a for a in _reading(rules, matcher, absent=False) if a[0] == name}
        absent = _reading(rules, matcher, absent=True)
        named = "; ".join(f"{'recording rule' if kind == 'record' else 'alert'} {name} "
                          f"({', '.join(f'{m}{{{matcher}}}' for m in sorted(metrics))})"
                          for (kind, name), metrics in sorted(by_rule.items()))
        blind = alerts - absent
        count = f" ({len(blind)} alerting rules)" if len(blind) > 1 else ""
        what = f"{_said(blind)}{count} can never fire on it" if blind else "no alert reads it"
        if absent:
            what += f"; {_said(absent)}, reading it inside absent(), fire at every evaluation instead"
        value = matcher.partition('"')[2][:-1]
        near = [] if "=~" in matcher else (
            sorted(j for j in jobs if value in j or j in value)
            or difflib.get_close_matches(value, sorted(jobs), n=1, cutoff=0.6))[:1]
        likely = f" (likely job=\"{near[0]}\")" if near else ""
        found.append(Finding(HIGH, "alert-selects-no-job", (
            f"{named}: {matcher} names no job the head's Prometheus scrapes (a series' job label is its scrape "
            "config's job_name, or what its static labels or relabelling set: prometheus/prometheus scrape/target.go "
            "PopulateDiscoveredLabels), so the selector returns nothing and the rule records or fires nothing: "
            f"{what} (promtool checks the rules alone and passes). Name one of the jobs the head scrapes{likely}: "
            f"{', '.join(sorted(jobs))} (a selector copied from the kube-prometheus mixin names the mixin's jobs, "
            "not kilonode's)"),
            tuple(sorted({name for name, _ in alerts | absent})) or tuple(name for _, name in sorted(by_rule)),
            cause=f"{matcher} scraped by no job"))
    return found


# ---- scrape limits below the plan's load (scrape-limit-below-load) ------------------------------------------------
#
# From an independent trace on research-7500 (10b): `sample_limit: 100000` on the kube-state-metrics job was "No risk
# found". prometheus/prometheus@v3.5.5 docs/configuration/configuration.md <scrape_config>: "Per-scrape limit on the
# number of scraped samples that will be accepted. If more than this number of samples are present after metric
# relabeling the entire scrape will be treated as failed" (label_limit alike: "more than this number of labels ...
# on any sample"; target_limit: "more than this number of targets are present after target relabeling, Prometheus
# will mark the targets as failed without scraping them"); a job's 0 (unset) takes the global section's
# (config/config.go ScrapeConfig.Validate: `if c.SampleLimit == 0 { c.SampleLimit = globalConfig.SampleLimit }`, the
# same for TargetLimit and LabelLimit). scrape/scrape.go scrapeAndReport: an append past the limit is rolled back,
# appended again empty "to trigger stale markers", and reported as the scrape's error (`up` 0): every series of the
# target goes stale at once, every scrape. The load is the plan's own (kilonode.plan.resolve.monitoring
# series_terms, its figures in kilonode.plan.defaults.monitoring), per scrape of one target.

SCRAPE_LIMIT_RULE = "scrape-limit-below-load"
# kilonode.render.monitoring's job names (named here, not imported: the review reads rendered sides).
_JOB_APISERVER, _JOB_SCHEDULER, _JOB_CM = "kilonode-apiserver", "kilonode-scheduler", "kilonode-controller-manager"
_JOB_KUBELET, _JOB_CADVISOR, _JOB_KSM = "kilonode-kubelet", "kilonode-cadvisor", "kilonode-kube-state-metrics"
_JOB_CERTS, _JOB_TRAFFIC = "kilonode-certificates", "kilonode-pod-traffic"
_JOB_AUTOSCALER = "kilonode-cluster-autoscaler"
_JOB_GPU_AGENT, _JOB_GPU_CONTROLLER = "kilonode-gpu-health-agent", "kilonode-gpu-health-controller"
_JOB_ETCD_PREFIX = "kilonode-etcd-"
# A job's metric names no selector ties to it by `job=`: kube-state-metrics names every metric it exports kube_*
# (kubernetes/kube-state-metrics docs/metrics: each family "kube_<resource>_..."), and kilonode's rules read
# kube_node_* without a job matcher.
_EXPORTED_PREFIXES = {_JOB_KSM: ("kube_",)}
_LIMITS = {"sample_limit": "samples per scrape", "label_limit": "labels per sample", "target_limit": "targets"}


class JobLoad(NamedTuple):
    samples: int      # per scrape of one target
    targets: int      # after relabelling, at the size the plan sizes Prometheus for
    why: str          # the plan's arithmetic, said in the finding


def _pool_reach(plan: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], int]]:
    """(pool, the nodes Prometheus is sized for there): the plan's "nodes of <pool> (...)" series terms' targets
    (series_terms: maxNodes and room declared for growth), else the pool's nodes."""
    terms = {str(t.get("what", "")).split(" (", 1)[0].removeprefix("nodes of "): int(t.get("targets") or 0)
             for t in ((plan.get("prometheus") or {}).get("terms") or []) if isinstance(t, Mapping)
             and str(t.get("what", "")).startswith("nodes of ")}
    return [(p, terms.get(str(p.get("name")), int(p.get("nodes") or 0)))
            for p in plan.get("nodePools") or [] if isinstance(p, Mapping)]


def job_loads(plan: Mapping[str, Any]) -> dict[str, JobLoad]:
    """scrape job -> the plan's load on it; a job the plan has no figure for is absent (not judged). The figures are
    kilonode.plan.resolve.monitoring's (per_node_series, series_terms), per job rather than per pool."""
    pools = _pool_reach(plan)
    if not pools:
        return {}
    nodes = sum(n for _, n in pools)
    pods = sum(n * int(p.get("maxPods") or 0) for p, n in pools)
    most_pods = max(int(p.get("maxPods") or 0) for p, _ in pools)
    gpu = [(p, n) for p, n in pools if int(p.get("gpusPerNode") or 0)]
    instances = len((plan.get("controlPlane") or {}).get("instances") or [])
    etcd = [len((plan.get(key) or {}).get("members") or []) for key in ("etcdMain", "etcdEvents", "etcdLeases")]
    loads = {
        _JOB_KSM: JobLoad(
            defaults.PROMETHEUS_KSM_SERIES_PER_NODE * nodes + defaults.PROMETHEUS_KSM_SERIES_PER_POD * pods, 1,
            f"one kube-state-metrics answers for the whole cluster (kilonode does not shard it, docs/monitoring.md): "
            f"{defaults.PROMETHEUS_KSM_SERIES_PER_NODE} series per node x {nodes:,} nodes + "
            f"{defaults.PROMETHEUS_KSM_SERIES_PER_POD} per pod x {pods:,} pods (the pools' maxPods)"),
        _JOB_KUBELET: JobLoad(defaults.PROMETHEUS_SERIES_PER_KUBELET, nodes,
                              f"{defaults.PROMETHEUS_SERIES_PER_KUBELET:,} series per kubelet"),
        _JOB_CADVISOR: JobLoad(defaults.PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER * most_pods, nodes,
                               f"{defaults.PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER} series per container x "
                               f"{most_pods} (the largest maxPods)"),
        _JOB_TRAFFIC: JobLoad(defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE
                              + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD * most_pods, nodes,
                              f"{defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE} + "
                              f"{defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD} per pod x {most_pods}"),
        _JOB_APISERVER: JobLoad(defaults.PROMETHEUS_SERIES_PER_APISERVER, instances,
                                f"{defaults.PROMETHEUS_SERIES_PER_APISERVER:,} series per apiserver"),
        _JOB_SCHEDULER: JobLoad(defaults.PROMETHEUS_SERIES_PER_SCHEDULER, instances,
                                f"{defaults.PROMETHEUS_SERIES_PER_SCHEDULER:,} series per kube-scheduler"),
        _JOB_CM: JobLoad(defaults.PROMETHEUS_SERIES_PER_CONTROLLER_MANAGER, instances,
                         f"{defaults.PROMETHEUS_SERIES_PER_CONTROLLER_MANAGER:,} series per controller manager"),
        _JOB_CERTS: JobLoad(defaults.PROMETHEUS_SERIES_PER_CERT_TARGET, sum(etcd) + instances,
                            f"{defaults.PROMETHEUS_SERIES_PER_CERT_TARGET} series per host"),
        _JOB_GPU_CONTROLLER: JobLoad(defaults.PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER, instances,
                                     f"{defaults.PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER} series per controller"),
        _JOB_AUTOSCALER: JobLoad(defaults.PROMETHEUS_SERIES_PER_AUTOSCALER, defaults.CLUSTER_AUTOSCALER_REPLICAS,
                                 f"{defaults.PROMETHEUS_SERIES_PER_AUTOSCALER:,} series per replica"),
    }
    for role, members in zip(("main", "events", "leases"), etcd, strict=True):
        if members:
            per = defaults.PROMETHEUS_SERIES_PER_ETCD_MEMBER
            loads[_JOB_ETCD_PREFIX + role] = JobLoad(per, members, f"{per:,} series per member")
    if gpu:
        most_gpus = max(int(p.get("gpusPerNode") or 0) for p, _ in gpu)
        loads[_JOB_GPU_AGENT] = JobLoad(
            defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE + defaults.PROMETHEUS_GPU_AGENT_FINDING_SERIES
            + defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_GPU * most_gpus, sum(n for _, n in gpu),
            f"{defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE} + {defaults.PROMETHEUS_GPU_AGENT_FINDING_SERIES} + "
            f"{defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_GPU} per GPU x {most_gpus}")
    return loads


def _limit(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def scrape_limits(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], int]:
    """(job, sample_limit | label_limit | target_limit) -> the limit in force (the job's, else its configuration's
    global one), for every job of the side's deployed Prometheus configuration that has one."""
    found: dict[tuple[str, str], int] = {}
    for config in _deployed_scrape_documents(entry):
        glob = config.get("global") if isinstance(config.get("global"), Mapping) else {}
        for job in config["scrape_configs"]:
            if not isinstance(job, Mapping) or not job.get("job_name"):
                continue
            for key in _LIMITS:
                value = _limit(job.get(key)) or _limit(glob.get(key))
                if value:
                    found[(str(job["job_name"]), key)] = value
    return found


def _over(entry: Mapping[str, Any] | None) -> tuple[dict[tuple[str, str], tuple[int, int, str]], set[str]]:
    """({(job, limit) -> (limit, the plan's figure, its arithmetic)} for each limit below the plan's load, the jobs
    with a limit and no figure in the plan)."""
    loads = job_loads(plan_of(entry))
    over: dict[tuple[str, str], tuple[int, int, str]] = {}
    unjudged: set[str] = set()
    for (job, key), value in scrape_limits(entry).items():
        load = loads.get(job)
        if load is None:
            unjudged.add(job)
            continue
        figure, why = {
            "sample_limit": (load.samples, load.why),
            "target_limit": (load.targets, "targets at the size the plan sizes Prometheus for"),
            # an average (plan defaults PROMETHEUS_LABEL_PAIRS_PER_SERIES): a limit under it fails most scrapes
            "label_limit": (defaults.PROMETHEUS_LABEL_PAIRS_PER_SERIES,
                            "the plan's average label pairs per series (kilonode.plan.defaults.monitoring)"),
        }[key]
        if value < figure:
            over[(job, key)] = (value, figure, why)
    return over, unjudged


def _job_reads(job: str, jobs: set[str]) -> Callable[[str], set[str]]:
    """An expression -> {job} where a selector of it reads the job's series: by `job="..."`/`=~` matching the job,
    or (no job matcher) by a metric name the job exports (_EXPORTED_PREFIXES)."""
    prefixes = _EXPORTED_PREFIXES.get(job, ())

    def find(expr: str) -> set[str]:
        try:
            read = selectors(expr)
        except PromQLSyntax:
            return set()
        for s in read:
            named = [(op, v) for label, op, v in s.matchers if label == "job" and op in ("=", "=~")]
            if any((op == "=" and v == job) or (op == "=~" and _fullmatch(v, job)) for op, v in named):
                return {job}
            if not named and s.metric.startswith(prefixes) and prefixes:
                return {job}
        return set()
    return find


def scrape_limits_below_load(diff: StackDiff) -> list[Finding]:
    """Each head scrape job whose sample, label or target limit is below the plan's figure for it, where the base's
    was not (or was another limit, or the plan's figure moved): every scrape of it fails, its series go stale."""
    after, unjudged = _over(diff.head)
    if unjudged:
        diff.note(f"scrape limits of {', '.join(sorted(unjudged))} were not judged: the plan has no per-job series "
                  "estimate for " + ("them" if len(unjudged) > 1 else "it"))
    if not after:
        return []
    before, _ = _over(diff.base)
    rules = alert_rules(diff.head)
    jobs = {job for job, _ in after}
    found = []
    for (job, key), (value, figure, why) in sorted(after.items()):
        if before.get((job, key)) == (value, figure, why):
            continue
        alerts = sorted(_per_alert(rules, _job_reads(job, jobs)))
        up = [a for a in alerts if a in _per_alert(rules, _up_of(job))]
        blind = [a for a in alerts if a not in up]
        one = len(blind) == 1
        said = (f"{', '.join(blind)} read{'s' if one else ''} its series and go{'es' if one else ''} blind (stale, so "
                "the expressions return nothing)" if blind else "no alert reads its series")
        if up:
            said += f"; {', '.join(up)} (on up{{job}}) fire{'s' if len(up) == 1 else ''} instead, target down"
        what = {"sample_limit": "every scrape of it carries more samples than that, so each is treated as failed",
                "label_limit": "most of its series carry more labels than that, so every scrape is treated as failed",
                "target_limit": "it discovers more targets than that, so every target is marked failed unscraped"}[key]
        fix = {"sample_limit": f"raise it above {figure:,} with headroom for growth, or remove it",
               "label_limit": "raise it well above the series' label count, or remove it",
               "target_limit": f"raise it above {figure:,}, or remove it"}[key]
        found.append(Finding(HIGH, SCRAPE_LIMIT_RULE, (
            f"job {job}: {key} {value:,} is below the plan's {figure:,} {_LIMITS[key]} ({why}): {what} "
            "(prometheus/prometheus docs/configuration/configuration.md <scrape_config>; scrape/scrape.go rolls the "
            "append back, writes stale markers and reports up 0), so none of its series is stored: " + said
            + f". Fix: {fix} (a job's unset limit takes the global one, config/config.go ScrapeConfig.Validate)"),
            (f"job {job}", *blind, *up), cause=f"{job} {key}"))
    return found


def _up_of(job: str) -> Callable[[str], set[str]]:
    """An expression -> {job} where it reads `up` of the job (a failed scrape sets it 0: the alert fires)."""
    def find(expr: str) -> set[str]:
        try:
            read = selectors(expr)
        except PromQLSyntax:
            return set()
        return {job} if any(s.metric == "up" and any(
            label == "job" and ((op == "=" and v == job) or (op == "=~" and _fullmatch(v, job)))
            for label, op, v in s.matchers) for s in read) else set()
    return find
