"""Every rendered flag and component-config field exists in the program that reads it.

Under the mock engine any input is accepted, so the shipped stacks' rendered units and config
files are checked against tests/render/upstream_flags.toml, a reference taken from each
program's own source at the pinned version (each entry names its repo, ref and path): a flag
the program does not register, a deprecated one, one it ignores in the configuration rendered
(say, a kube-scheduler flag that --config overrides), a flag combination it rejects, and a
config field missing from the Go types all fail here.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.plan import ClusterPlan
from kilonode.render import HostFiles
from tests import shared
from tests.conftest import SHIPPED_STACKS

REFERENCE: dict[str, Any] = tomllib.loads(Path(__file__).with_name("upstream_flags.toml").read_text())
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet")
# etcd is the pinned etcd release in node-image/binaries.toml (components.etcd, 3.5.33), which
# the etcd image carries; its rendered flags are checked against that major.minor.
ETCD_PIN = tomllib.loads((Path(__file__).parents[2] / "node-image" / "binaries.toml").read_text())
ETCD_VERSION = ".".join(ETCD_PIN["components"]["etcd"]["version"].split(".")[:2])
CONFIG_FILES = (
    "etc/kubernetes/kubelet-config.yaml",
    "etc/kubernetes/kube-scheduler-config.yaml",
    "etc/kubernetes/authentication-config.yaml",
)


# ---------------------------------------------------------------- reading rendered files

def program_of(unit: str) -> str:
    """The program a unit's ExecStart runs (the module or script for kilonode's own)."""
    logical = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart=")
    binary, *args = logical.rstrip("\\").split()
    if binary.endswith("/python3") and args:
        binary = args[1] if args[0] == "-m" and len(args) > 1 else args[0]
    return binary.rsplit("/", 1)[-1]


def exec_start(unit: str) -> tuple[str, dict[str, str]]:
    """(program, {flag: value}) of a unit's ExecStart, as systemd_exec writes it."""
    lines = unit.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    logical = lines[start].removeprefix("ExecStart=")
    i = start
    while logical.endswith("\\"):
        i += 1
        logical = logical[:-1] + " " + lines[i]
    binary, *args = logical.split()
    if binary.endswith("/python3") and args[:1] == ["-m"]:  # kilonode's own programs: the module
        binary, *args = args[1:]
    elif binary.endswith("/python3") and args and args[0].endswith(".py"):  # ... or the script
        binary, *args = args
    flags: dict[str, str] = {}
    for arg in args:
        match = re.fullmatch(r"--([a-z0-9.-]+)=(.*)", arg)
        assert match, f"{binary}: {arg!r} is not --name=value"
        assert match.group(1) not in flags, f"{binary}: --{match.group(1)} given twice"
        flags[match.group(1)] = match.group(2)
    return binary.rsplit("/", 1)[-1], flags


def version_of(program: str, plan: ClusterPlan) -> str:
    return ETCD_VERSION if program == "etcd" else f"1.{plan.kubernetes_minor}"


def rendered(plans: dict[str, ClusterPlan]) -> list[tuple[str, ClusterPlan, str, HostFiles]]:
    return [(stack, plans[stack], host, files)
            for stack in SHIPPED_STACKS for host, files in shared.rendered(stack).items()]


# ---------------------------------------------------------------- checking against the reference

def flag_problems(program: str, version: str, flags: dict[str, str]) -> list[str]:
    entry = REFERENCE["flags"].get(program, {}).get(version)
    if entry is None:
        return [f"{program} {version}: no reference in upstream_flags.toml"]
    known = {name for source in entry["sources"] for name in source["flags"]}
    deprecated = {name for source in entry["sources"] for name in source.get("deprecated", [])}
    problems = [f"{program} {version}: --{name} is not a flag of {program} (upstream_flags.toml)"
                for name in flags if name not in known]
    problems += [f"{program} {version}: --{name} is deprecated upstream" for name in flags if name in deprecated]
    for rule in entry.get("rules", []):
        hit = [name for name in rule["flags"] if name in flags]
        if rule["kind"] == "conflicts":
            if rule["with"] in flags:
                problems += [f"{program} {version}: --{name} conflicts with --{rule['with']} ({rule['source']})"
                             for name in hit]
            continue
        assert rule["kind"] == "ignored", rule
        if "when_set" in rule:
            applies = rule["when_set"] in flags
        elif "unless" in rule:
            applies = any(flags.get(name) != value for name, value in rule["unless"].items())
        else:
            applies = True
        if applies:
            problems += [f"{program} {version}: --{name} is ignored ({rule['source']})" for name in hit]
    return problems


SCALARS = {
    "bool": bool, "string": str, "metav1.Duration": str,
    **{t: int for t in ("int", "int32", "int64", "uint", "uint32", "uint64")},
    **{t: (int, float) for t in ("float32", "float64")},
}


def config_problems(document: dict[str, Any], minor: str) -> list[str]:
    key = f"{document.get('apiVersion')}/{document.get('kind')}"
    ref = REFERENCE["configs"].get(minor, {}).get(key)
    if ref is None:
        return [f"{key}: no reference for {minor} in upstream_flags.toml"]
    types, enums = ref["types"], ref.get("enums", {})
    problems: list[str] = []

    def fields_of(gotype: str) -> dict[str, str] | None:
        if gotype not in types:
            return None
        fields = {k: v for k, v in types[gotype].items() if k != "..."}
        for embedded in types[gotype].get("...", []):
            fields.update(fields_of(embedded) or {})
        return fields

    def walk(value: Any, gotype: str, path: str) -> None:
        gotype = gotype.lstrip("*")
        if gotype.startswith("[]"):
            if not isinstance(value, list):
                problems.append(f"{key} {path}: expected a list ({gotype})")
                return
            for i, item in enumerate(value):
                walk(item, gotype[2:], f"{path}[{i}]")
            return
        if gotype.startswith("map["):
            if not isinstance(value, dict):
                problems.append(f"{key} {path}: expected a map ({gotype})")
                return
            for name, item in value.items():
                walk(item, gotype[gotype.index("]") + 1:], f"{path}.{name}")
            return
        fields = fields_of(gotype)
        if fields is None:
            if isinstance(value, (dict, list)):
                problems.append(f"{key} {path}: Go type {gotype} is not in the reference")
            elif gotype in enums and value not in enums[gotype]:
                problems.append(f"{key} {path}: {value!r} is not a {gotype} ({', '.join(enums[gotype])})")
            elif gotype in SCALARS and (not isinstance(value, SCALARS[gotype])
                                        or (isinstance(value, bool) and SCALARS[gotype] is not bool)):
                problems.append(f"{key} {path}: {value!r} is not a {gotype}")
            return
        if not isinstance(value, dict):
            problems.append(f"{key} {path}: expected an object ({gotype})")
            return
        for name, item in value.items():
            where = f"{path}.{name}" if path else name
            if name not in fields:
                problems.append(f"{key} {where}: no field {name!r} in {gotype} (upstream_flags.toml)")
            elif fields[name] == "runtime.RawExtension":
                args_type = ref.get("plugin_args", {}).get(value.get("name"))
                if args_type is None:
                    problems.append(f"{key} {where}: no typed args for plugin {value.get('name')!r}")
                else:
                    walk(item, args_type, where)
            else:
                walk(item, fields[name], where)

    walk(document, ref["root"], "")
    if "plugin_names" in ref:
        known = set(ref["plugin_names"]["names"])
        for p, profile in enumerate(document.get("profiles", [])):
            for point, sets in (profile.get("plugins") or {}).items():
                for state in ("enabled", "disabled"):
                    for plugin in sets.get(state) or []:
                        if plugin["name"] not in known | ({"*"} if state == "disabled" else set()):
                            problems.append(f"{key} profiles[{p}].plugins.{point}.{state}: "
                                            f"no in-tree plugin {plugin['name']!r}")
            for config in profile.get("pluginConfig") or []:
                if config["name"] not in known:
                    problems.append(f"{key} profiles[{p}].pluginConfig: no in-tree plugin {config['name']!r}")
    return problems


# ---------------------------------------------------------------- the shipped stacks

def test_every_rendered_flag_is_a_live_flag_of_its_program(plans: dict[str, ClusterPlan]) -> None:
    problems, seen = [], set()
    for stack, plan, host, files in rendered(plans):
        for path, file in files.items():
            if not path.startswith("etc/systemd/system/") or not path.endswith(".service"):
                continue
            if program_of(file.content) not in PROGRAMS:
                continue  # a boot script with positional arguments (fabric-label OUTPUT), ...
            program, flags = exec_start(file.content)
            seen.add(program)
            problems += [f"{stack}/{host}/{path}: {p}"
                         for p in flag_problems(program, version_of(program, plan), flags)]
    assert seen == set(PROGRAMS)
    assert not problems, "\n".join(problems)


def test_every_rendered_config_field_exists_upstream(plans: dict[str, ClusterPlan]) -> None:
    problems, seen = [], set()
    for stack, plan, host, files in rendered(plans):
        for path in CONFIG_FILES:
            if path in files:
                seen.add(path)
                document = yaml.safe_load(files[path].content)
                minor = f"1.{plan.kubernetes_minor}"
                problems += [f"{stack}/{host}/{path}: {p}" for p in config_problems(document, minor)]
    assert seen == set(CONFIG_FILES)
    assert not problems, "\n".join(problems)


def test_profiling_is_off_where_the_program_reads_it() -> None:
    """CIS 1.2.x/1.3.2/1.4.1: the flag where the program honours it, the file where --config rules."""
    files = shared.rendered("research-7500")["apiserver-0"]
    for unit in ("kube-apiserver", "kube-controller-manager"):
        assert exec_start(files[f"etc/systemd/system/{unit}.service"].content)[1]["profiling"] == "false"
    _, scheduler = exec_start(files["etc/systemd/system/kube-scheduler.service"].content)
    assert "profiling" not in scheduler and "config" in scheduler
    assert yaml.safe_load(files["etc/kubernetes/kube-scheduler-config.yaml"].content)["enableProfiling"] is False


# ---------------------------------------------------------------- the checks catch mistakes

@pytest.fixture(scope="module")
def apiserver_files() -> HostFiles:
    return shared.rendered("research-7500")["apiserver-0"]


def test_a_misspelt_flag_is_caught(apiserver_files: HostFiles) -> None:
    program, flags = exec_start(apiserver_files["etc/systemd/system/kube-apiserver.service"].content)
    flags["authorisation-mode"] = flags.pop("authorization-mode")
    problems = flag_problems(program, "1.34", flags)
    assert problems == [
        "kube-apiserver 1.34: --authorisation-mode is not a flag of kube-apiserver (upstream_flags.toml)"]


def test_a_misspelt_config_field_is_caught() -> None:
    files = shared.rendered("research-7500")["pool-h100-ib"]
    document = yaml.safe_load(files["etc/kubernetes/kubelet-config.yaml"].content)
    document["serialiseImagePulls"] = document.pop("serializeImagePulls")
    document["authentication"]["x509"]["clientCaFile"] = document["authentication"]["x509"].pop("clientCAFile")
    problems = config_problems(document, "1.34")
    assert any("serialiseImagePulls" in p for p in problems), problems
    assert any("authentication.x509.clientCaFile" in p for p in problems), problems
    assert len(problems) == 2, problems


def test_a_misspelt_scheduler_plugin_and_a_wrong_enum_are_caught(apiserver_files: HostFiles) -> None:
    document = yaml.safe_load(apiserver_files["etc/kubernetes/kube-scheduler-config.yaml"].content)
    profile = document["profiles"][0]
    profile["plugins"]["score"]["enabled"][1]["name"] = "InterPodAfinity"
    profile["pluginConfig"][0]["args"]["scoringStrategy"]["type"] = "MostRequested"
    problems = config_problems(copy.deepcopy(document), "1.34")
    assert any("'InterPodAfinity'" in p for p in problems), problems
    assert any("'MostRequested' is not a ScoringStrategyType" in p for p in problems), problems


def test_flags_ignored_in_the_rendered_configuration_are_caught(apiserver_files: HostFiles) -> None:
    # kube-scheduler reads the deprecated --profiling only without --config
    program, flags = exec_start(apiserver_files["etc/systemd/system/kube-scheduler.service"].content)
    assert any("--profiling is ignored" in p for p in flag_problems(program, "1.34", {**flags, "profiling": "false"}))
    without_config = flag_problems(program, "1.34", {"profiling": "false"})
    assert without_config == ["kube-scheduler 1.34: --profiling is deprecated upstream"]
    # kube-controller-manager reads --service-cluster-ip-range only for node IPAM
    program, flags = exec_start(apiserver_files["etc/systemd/system/kube-controller-manager.service"].content)
    with_range = {**flags, "service-cluster-ip-range": "172.16.0.0/16"}
    assert any("--service-cluster-ip-range is ignored" in p for p in flag_problems(program, "1.34", with_range))
    assert not flag_problems(program, "1.34", {**with_range, "allocate-node-cidrs": "true"})
    # kube-apiserver rejects --anonymous-auth next to an authentication config
    program, flags = exec_start(apiserver_files["etc/systemd/system/kube-apiserver.service"].content)
    with_flag = {**flags, "anonymous-auth": "false"}
    assert any("--anonymous-auth conflicts" in p for p in flag_problems(program, "1.34", with_flag))


def test_the_reference_names_its_sources_and_rules_name_known_flags() -> None:
    for program, versions in REFERENCE["flags"].items():
        for version, entry in versions.items():
            known = {name for source in entry["sources"] for name in source["flags"]}
            for source in entry["sources"]:
                assert source["repo"] and source["path"], (program, version, source)
                assert source.get("ref") or source.get("read_from"), (program, version, source)
                assert set(source.get("deprecated", [])) <= set(source["flags"]), (program, source["path"])
            for rule in entry.get("rules", []):
                assert rule.get("source"), (program, rule)
                assert set(rule["flags"]) <= known, (program, set(rule["flags"]) - known)
                for other in (rule.get("when_set"), rule.get("with"), *rule.get("unless", {})):
                    assert other is None or other in known, (program, other)
