"""A strict reader of Prometheus' text exposition format (0.0.4), for the tests of what kilonode's
node programs answer: every sample's family declared by HELP and TYPE before it and once, names
and label names of the format's alphabet, label values with only the escapes the format has,
values Go's ParseFloat accepts, no series twice, counters named _total. Prometheus' own parser
reads the same answers in tests/monitoring/test_gpu_health_metrics.py (promtool check metrics)."""

from __future__ import annotations

import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
SAMPLE = re.compile(rf"^({NAME})(?:\{{(.*)\}})? (\S+)$")
PAIR = re.compile(rf'({LABEL})="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
VALUE = re.compile(r"^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|[+-]Inf|NaN)$")
KINDS = {"counter", "gauge", "histogram", "summary", "untyped"}

Series = tuple[str, frozenset[tuple[str, str]]]


class ExpositionError(ValueError):
    pass


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _labels(text: str, line: str) -> frozenset[tuple[str, str]]:
    pairs, at = [], 0
    while at < len(text):
        match = PAIR.match(text, at)
        if match is None:
            raise ExpositionError(f"bad labels at {text[at:]!r}: {line!r}")
        pairs.append((match.group(1), _unescape(match.group(2))))
        at = match.end()
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ExpositionError(f"a label twice: {line!r}")
    return frozenset(pairs)


def parse(text: str) -> tuple[dict[Series, float], dict[str, str]]:
    """(series -> value, family -> type); ExpositionError at the first thing the format refuses."""
    if not text.endswith("\n"):
        raise ExpositionError("the exposition must end with a line feed")
    samples: dict[Series, float] = {}
    helps: set[str] = set()
    kinds: dict[str, str] = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            if not re.fullmatch(NAME, name) or name in helps or name in {n for n, _ in samples}:
                raise ExpositionError(f"HELP out of place: {line!r}")
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            if kind not in KINDS or name in kinds or name not in helps:
                raise ExpositionError(f"TYPE out of place: {line!r}")
            if kind == "counter" and not name.endswith("_total"):
                raise ExpositionError(f"a counter not named _total: {line!r}")
            kinds[name] = kind
        else:
            match = SAMPLE.match(line)
            if match is None or not VALUE.match(match.group(3)):
                raise ExpositionError(f"not a sample: {line!r}")
            name = match.group(1)
            if name not in kinds:
                raise ExpositionError(f"a sample of an undeclared family: {line!r}")
            series = (name, _labels(match.group(2) or "", line))
            if series in samples:
                raise ExpositionError(f"a series twice: {line!r}")
            samples[series] = float(match.group(3).replace("Inf", "inf"))
    return samples, kinds


def values(text: str) -> dict[str, float]:
    """The samples as 'name{a="x",b="y"}' (labels sorted) -> value."""
    samples, _ = parse(text)
    return {name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}" if labels else ""): value
            for (name, labels), value in samples.items()}
