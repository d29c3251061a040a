"""kube-bench's test semantics, for the vendored CIS benchmark files (tests/security/cis/).

kube-bench runs each check's `audit` (a shell command: `ps -ef | grep kube-apiserver`, `stat -c
permissions=%a <file>`, a kubectl loop) and, when a test item's flag is not in that output, its
`audit_config` (a file's text, read with a JSONPath), then applies the check's `tests`. This
module is the second half, ported from kube-bench's check/test.go and check/check.go at
BENCHMARK_COMMIT; tests/security/test_cis.py supplies the audit outputs from kilonode's
rendered artefacts. What is ported, with the Go function it follows:

- a test item's `set` defaults to true (testItem.UnmarshalYAML);
- a flag is found in the command output by the regex `(<flag>)(=|: *)*([^\\s]*) *`; a flag with
  no value reads "true" when it starts with `--`, else the flag itself (flagTestItem.findValue);
- a `path` is a Kubernetes JSONPath over the config document, missing keys allowed, and it is
  "found" when it prints something (pathTestItem.findValue);
- `set: false` passes when the item is not found; `set: true` with a `compare` compares when
  found and fails when not (testItem.evaluate);
- ops eq / noteq (case-insensitive for true/false), gt / gte / lt / lte (integers), has /
  nothave (substring), regex, valid_elements (comma lists), bitmask (octal) (compareOp);
- `use_multiple_values`: every output line must pass (testItem.execute);
- items are joined by `bin_op` and (the default) or or (Check.execute); an item not found in
  the command output is looked up in the config output (Check.execute's fallback).

`env` items (etcd's ETCD_* variables) are read only through a check's `audit_env`, which no
vendored check has; a check that gains one raises here until its source is supplied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BENCHMARK_DIR = Path(__file__).with_name("cis") / "cis-1.10"
BENCHMARK_COMMIT = "a73ce378418c71c5861e6963753f50dec3badadf"
# The files, in the benchmark's order (config.yaml holds no checks).
CONTROLS = ("master", "etcd", "controlplane", "node", "policies")
MANUAL = "manual"


@dataclass(frozen=True)
class TestItem:
    __test__ = False  # a kube-bench test item, not a pytest class

    flag: str
    path: str = ""
    env: str = ""
    set: bool = True
    op: str = ""
    value: str = ""

    @staticmethod
    def from_yaml(raw: Mapping[str, Any]) -> TestItem:
        compare = raw.get("compare") or {}
        unknown = set(raw) - {"flag", "path", "env", "set", "compare"}
        if unknown:
            raise ValueError(f"test item keys kube_bench.py does not know: {sorted(unknown)}")
        return TestItem(
            flag=str(raw.get("flag", "")),
            path=str(raw.get("path", "")),
            env=str(raw.get("env", "")),
            set=bool(raw.get("set", True)),
            op=str(compare.get("op", "")),
            value=_go_string(compare.get("value", "")),
        )


@dataclass(frozen=True)
class Check:
    id: str
    text: str
    type: str
    scored: bool
    audit: str
    audit_config: str
    audit_env: str
    multiple: bool
    bin_op: str
    items: tuple[TestItem, ...]

    @property
    def manual(self) -> bool:
        return self.type.strip() == MANUAL

    @property
    def section(self) -> str:
        return self.id.split(".")[0]


def _go_string(value: Any) -> str:
    """A YAML scalar as kube-bench's Go struct field (string) receives it: `false` -> "false"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def load_checks(directory: Path = BENCHMARK_DIR) -> list[Check]:
    checks: list[Check] = []
    for name in CONTROLS:
        document = yaml.safe_load((directory / f"{name}.yaml").read_text())
        for group in document["groups"]:
            for raw in group["checks"]:
                tests = raw.get("tests") or {}
                checks.append(Check(
                    id=str(raw["id"]),
                    text=" ".join(str(raw["text"]).split()),
                    type=str(raw.get("type", "")),
                    scored=bool(raw.get("scored", False)),
                    audit=str(raw.get("audit", "")),
                    audit_config=str(raw.get("audit_config", "")),
                    audit_env=str(raw.get("audit_env", "")),
                    multiple=bool(raw.get("use_multiple_values", False)),
                    bin_op=str(tests.get("bin_op", "")),
                    items=tuple(TestItem.from_yaml(item) for item in tests.get("test_items") or []),
                ))
    return checks


# ---------------------------------------------------------------- finding a value

def find_flag(flag: str, output: str) -> tuple[bool, str]:
    """flagTestItem.findValue: (found, value) of `flag` in a command line or audit output."""
    if not output or not flag or flag not in output:
        return False, ""
    match = re.search("(" + flag + r")(=|: *)*([^\s]*) *", output)
    if match is None:
        raise ValueError(f"invalid flag in test item: {flag!r}")
    if match.group(3):
        return True, match.group(3)
    return True, "true" if flag.startswith("--") else match.group(1)


def _jsonpath_scalar(value: Any) -> str:
    """A value as client-go's jsonpath prints it (fmt's %v for scalars, JSON for the rest)."""
    if value is None:
        return ""  # AllowMissingKeys prints nothing for a missing or null leaf
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _walk(document: Any, dotted: str) -> Any:
    node = document
    for key in filter(None, dotted.split(".")):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# The JSONPath forms the vendored files use: `{.a.b}` and `{range .list[:]}{}{','}{end}`.
SIMPLE_PATH = re.compile(r"\{\.([A-Za-z0-9_.]+)\}")
RANGE_PATH = re.compile(r"\{range \.([A-Za-z0-9_.]+)\[:\]\}\{\}\{'(.*)'\}\{end\}")


def find_path(path: str, document: Any) -> tuple[bool, str]:
    """pathTestItem.findValue: (found, value) of a JSONPath in a parsed config document."""
    if simple := SIMPLE_PATH.fullmatch(path):
        value = _jsonpath_scalar(_walk(document, simple.group(1)))
    elif ranged := RANGE_PATH.fullmatch(path):
        items = _walk(document, ranged.group(1)) or []
        value = "".join(_jsonpath_scalar(item) + ranged.group(2) for item in items)
    else:
        raise ValueError(f"JSONPath form kube_bench.py does not evaluate: {path!r}")
    return value != "", value


# ---------------------------------------------------------------- comparing

def compare(op: str, found: str, expected: str) -> bool:
    """compareOp: whether the found value satisfies `op` against the expected one."""
    if op in ("eq", "noteq"):
        same = found.lower() == expected if found.lower() in ("true", "false") else found == expected
        return same if op == "eq" else not same
    if op in ("gt", "gte", "lt", "lte"):
        try:
            a, b = int(found.strip()), int(expected.strip())
        except ValueError:
            return False  # "Invalid Number(s) used for comparison"
        return {"gt": a > b, "gte": a >= b, "lt": a < b, "lte": a <= b}[op]
    if op == "has":
        return expected in found
    if op == "nothave":
        return expected not in found
    if op == "regex":
        return re.search(expected, found) is not None
    if op == "valid_elements":
        have, allowed = _elements(found), _elements(expected)
        if not have or not allowed:
            return not have and not allowed
        return all(element in allowed for element in have)
    if op == "bitmask":
        try:
            requested, most = int(found, 8), int(expected, 8)
        except ValueError:
            return False
        return most & requested == requested
    raise ValueError(f"compare op kube_bench.py does not know: {op!r}")


def _elements(text: str) -> list[str]:
    """splitAndRemoveLastSeparator(text, ",")."""
    clean = text.strip().rstrip(",")
    return [part.strip() for part in clean.split(",")] if clean else []


# ---------------------------------------------------------------- running a check

@dataclass(frozen=True)
class Audit:
    """What a check's audit commands would print on a host: `command` for `audit`, `config`
    for `audit_config` (a parsed document; None when the file is absent or not read)."""

    command: str = ""
    config: Any = None


@dataclass(frozen=True)
class ItemResult:
    passed: bool
    found: bool
    value: str
    source: str  # "command" or "config"


def _item(item: TestItem, text: str, config: Any, multiple: bool) -> ItemResult:
    """testItem.execute over the command output, then over the config as check.go falls back."""
    result = _evaluate(item, text, multiple)
    if not result.found and config is not None and item.path:
        lookup = find_path(item.path, config)
        result = _decide(item, *lookup, "config")
    return result


def _evaluate(item: TestItem, text: str, multiple: bool) -> ItemResult:
    text = text.rstrip(" \n")
    lines = text.split("\n") if multiple else [text]
    result = ItemResult(False, False, "", "command")
    for line in lines:
        result = _decide(item, *find_flag(item.flag, line), "command")
        if not result.passed:
            break
    return result


def _decide(item: TestItem, found: bool, value: str, source: str) -> ItemResult:
    if not item.set:
        return ItemResult(not found, found, value, source)
    if found and item.op:
        return ItemResult(compare(item.op, value, item.value), found, value, source)
    return ItemResult(found, found, value, source)


def run(check: Check, audit: Audit) -> tuple[bool, Sequence[ItemResult]]:
    """(passed, each item's result) of a check with tests, as kube-bench's Check.run decides
    it: PASS when true; FAIL (scored) or WARN (not scored) when false."""
    if check.manual or not check.items:
        raise ValueError(f"{check.id} has no tests to run (type {check.type!r})")
    if check.audit_env or any(item.env and not item.flag and not item.path for item in check.items):
        raise ValueError(f"{check.id} reads environment variables (audit_env): not evaluated here")
    results = [_item(item, audit.command, audit.config, check.multiple) for item in check.items]
    if check.bin_op in ("", "and"):
        return all(r.passed for r in results), results
    if check.bin_op == "or":
        return any(r.passed for r in results), results
    raise ValueError(f"{check.id}: unknown bin_op {check.bin_op!r}")
