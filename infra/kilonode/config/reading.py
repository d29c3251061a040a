"""How `pulumi up` reads a stack file, and which YAML kilonode refuses because two readers differ.

kilonode reads a stack file with PyYAML (YAML 1.1); `pulumi up` reads the same file with Go's
gopkg.in/yaml.v3 (mostly YAML 1.2) and hands the program `kilonode:cluster` as JSON text, which
the Python SDK turns back into values (`pulumi.Config.require_object`: `json.loads`). A value the
two read differently would be checked as one thing and deployed as another. So every plain
(unquoted) scalar is classified here, and the file is refused where the two could differ; what
is left is read alike by both, value for value (the Pulumi program checks that too, at run time:
kilonode.config.load.program_stack).

Pulumi's path, at the pinned SDK (3.272; pulumi/pulumi's newest source here is v3.259.0, and
none of these files changed between it and the snapshot's HEAD; both use yaml.v3 v3.0.1):

- pulumi/pulumi@v3.259.0:sdk/go/common/workspace/loaders.go:159 reads the file (a UTF-8 BOM
  stripped, :41-46), :181 decodes it into `any` with yaml.v3 (encoding/marshal.go:115), :219
  encodes that again as YAML (util/yamlutil/encode.go:25-33) and :222 decodes the result into
  the stack's `config.Map`: every value goes through yaml.v3 twice.
- :61-89 prefixes a config key with no `:` by the project's name: `cluster:` is
  `kilonode:cluster`.
- Each config value is decoded by sdk/go/common/resource/config/value.go:238-245 into an
  `object` (object.go:455-527): a map's non-text key becomes its Go `%v` text (:505-510), a
  timestamp becomes Go's `time.Time.String()` (:490-491), and a map whose only key is `secure`
  holding text is a ciphertext to decrypt (:492-494, :541-549). It reaches the program as JSON
  (object.go:401-419, :434-436: encoding/json).
- yaml.v3 resolves a plain scalar in go-yaml/yaml@v3.0.1:resolve.go:126-265: only
  `true`/`false` (three spellings each) are booleans (:52-53), `yes`/`no`/`on`/`off` are
  text; integers are parsed with Go's base prefixes after dropping every `_` (:191-202: `0x1F`,
  `0o17`, `017` octal, `1_000`); a decimal that does not fit 64 bits becomes a float (:204-209);
  `1e3` is a float (:124, :204); `1:20` is text (base 60 dropped, :165-167); a date is a
  timestamp (:180-189, :294-301); `.inf`/`.nan` are floats (:55-58).
- A float is written back by encode.go:391-398 as `strconv.FormatFloat(f, 'g', -1, 64)`: `8.0`
  and `1e3` come back as `8` and `1000`, integers from then on; encoding/json then writes a
  float at or above 1e21 in exponent form, which Python reads as a float, and refuses
  infinities and NaN.

PyYAML (YAML 1.1) reads `yes`/`on` as booleans, `012` as octal 10, `0o12` as text, `1:20` as
80, `1e3` as text and a date as a date. Neither reading is refused by the other's rules, so
both are refused here, with what to write instead.
"""

from __future__ import annotations

import math
import re

import yaml

# The integers yaml.v3 keeps exact: int64, and uint64 for larger positive ones (resolve.go:192-203).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
CANONICAL_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
CANONICAL_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+")
# Every plain scalar yaml.v3 could read as a number, with its `_` removed (resolve.go:191):
# Go's integer syntax with base 0 (sign, 0x/0o/0b prefix, leading-zero octal, decimal), the
# float pattern of resolve.go:124, and strconv.ParseFloat on text starting with `.` (:173-177).
# A superset: anything it matches and CANONICAL_* does not is refused.
GO_NUMBER = re.compile(r"[-+]?(?:0[xXoObB][0-9a-fA-F]*|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
                       r"|\.[0-9]+(?:[eE][-+]?[0-9]+)?)")
# YAML 1.1's booleans that YAML 1.2 reads as text (go-yaml/yaml@v3.0.1:encode.go:314-322,
# isOldBool: the same list yaml.v3 quotes on output for YAML 1.1 readers' sake); PyYAML reads
# all but y/n as booleans.
OLD_BOOLS = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON",
                       "n", "N", "no", "No", "NO", "off", "Off", "OFF"})
# yaml.v3's floats by name (resolve.go:55-58); PyYAML's are the same spellings
SPECIAL_FLOATS = frozenset({".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
                            "-.inf", "-.Inf", "-.INF"})
# A superset of yaml.v3's timestamps (resolve.go:294-325: four digits, '-', then a date and an
# optional time) and of PyYAML's (a date, then 'T', 't' or spaces and a time)
TIMESTAMP_LIKE = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:$|[Tt \t])")


def plain_scalar_problem(text: str, pyyaml_tag: str, is_key: bool = False) -> str | None:
    """What to write instead of the plain (unquoted) scalar `text`, or None when PyYAML and
    Pulumi read it alike. `pyyaml_tag`: the short tag PyYAML resolves it to (`int`, `str`, ...)."""
    quoted = f'"{_short(text)}"'
    if text in OLD_BOOLS:
        if text in "yYnN":
            readings = "text to Pulumi and to PyYAML, but a boolean in YAML 1.1's own list"
        else:
            readings = (f"the boolean {str(text.lower() in ('yes', 'on')).lower()} to YAML 1.1 readers (PyYAML) "
                        "and text to Pulumi (YAML 1.2)")
        return (f"the unquoted {text} is {readings}: write true or false for a boolean, or {quoted} in quotes "
                "for the text")
    if text in SPECIAL_FLOATS:
        return f"{text} is an infinity or not-a-number, which Pulumi's config cannot carry (JSON has none); no key " \
               "takes one"
    if TIMESTAMP_LIKE.match(text) or pyyaml_tag == "timestamp":
        return (f"the unquoted {_short(text)} is a timestamp to YAML, which Pulumi hands the program in Go's own "
                f"rendering ('2027-11-30 00:00:00 +0000 UTC') and PyYAML as a date: write it in quotes, {quoted}")
    if pyyaml_tag in ("int", "float") or GO_NUMBER.fullmatch(text.replace("_", "")):
        return _number_problem(text, is_key)
    if pyyaml_tag in ("merge", "value"):
        return f"the unquoted {_short(text)} is special to YAML 1.1 readers: write it in quotes, {quoted}"
    if is_key and pyyaml_tag in ("bool", "null"):
        return (f"a {'boolean' if pyyaml_tag == 'bool' else 'null'} as a key: Pulumi makes it the text "
                f"{'<nil>' if pyyaml_tag == 'null' else text.lower()!r}, PyYAML keeps the value; write the key in "
                f"quotes, {quoted}")
    return None


# The longest number worth reading: int64's 19 digits and a sign, with room for a float's
# exponent. Longer digit strings are refused before any conversion, since Python refuses
# int() of (and decimal output of) more than sys.get_int_max_str_digits() digits (4,300) with
# a ValueError, and a number this long fits no consumer anyway.
MAX_NUMBER_CHARS = 40


def _number_problem(text: str, is_key: bool) -> str | None:
    """A plain scalar that either reader takes as a number: only plain decimals read alike."""
    if len(text) > MAX_NUMBER_CHARS:
        return (f"a number of {len(text)} characters ({_short(text)}): no key takes a number this long "
                "(a 64-bit integer has at most 20); write a number in its consumer's range, or quote text")
    if is_key and not CANONICAL_INT.fullmatch(text):
        return (f"the number {_short(text)} as a key: Pulumi makes a key that is not text into Go's rendering of "
                f"it, PyYAML keeps the number; write the key in quotes, \"{_short(text)}\"")
    if CANONICAL_INT.fullmatch(text):
        if INT_MIN <= int(text) <= INT_MAX:
            return None
        return (f"{_short(text)} does not fit in 64 bits: Pulumi reads it as the float {float(text):g} (yaml.v3 "
                "keeps integers to int64 or uint64), PyYAML as the exact integer; no key takes a number this large")
    if CANONICAL_FLOAT.fullmatch(text):
        value = float(text)
        if not math.isfinite(value):
            return f"{_short(text)} is too large for a 64-bit float: Pulumi reads it as text, PyYAML as infinity"
        if not value.is_integer():
            return None
        whole = int(value)
        return (f"Pulumi hands the program {text} as the whole number {whole} (its config writes a float without a "
                f"fraction back as an integer), PyYAML as the float {value!r}: write {whole} for a number, or "
                f'"{_short(text)}" in quotes for text')
    go, py = go_number(text), pyyaml_value(text)
    if isinstance(go, float) and go.is_integer():
        go = int(go)  # what Pulumi hands the program: its config writes a whole float back as an int
    suggestion = go if isinstance(go, int | float) and not isinstance(go, bool) else None
    readings = (f"Pulumi (Go's YAML) reads the unquoted {_short(text)} as {_described(go)}, PyYAML (YAML 1.1) as "
                f"{_described(py)}" if go != py or type(go) is not type(py) else
                f"both YAML readers take the unquoted {_short(text)} as {_described(go)}, which YAML 1.2 "
                "readers and reviewers may not")
    number = f"write {suggestion!r} in plain decimal digits for a number, or " if suggestion is not None else ""
    return f'{readings}: {number}write "{_short(text)}" in quotes for text'


# yaml.v3's float syntax (resolve.go:124), tried on a scalar whose `_` are removed (:191, :204)
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_GO_INT = re.compile(r"([-+]?)(?:0[xX]([0-9a-fA-F]+)|0[oO]([0-7]+)|0[bB]([01]+)|0([0-7]+)|([1-9][0-9]*|0))")


def go_number(text: str) -> object:
    """What yaml.v3 reads a plain scalar of digits as (resolve.go:169-264): an int (Go's base-0
    syntax, `_` dropped, in int64 or uint64), else a finite float, else the text itself."""
    if text.startswith("."):  # resolve.go:173-177: strconv.ParseFloat on the text as it is
        return float(text) if re.fullmatch(r"\.[0-9]+(?:[eE][-+]?[0-9]+)?", text) else text
    plain = text.replace("_", "")
    match = _GO_INT.fullmatch(plain)
    if match:
        base, digits = next((b, d) for b, d in zip((16, 8, 2, 8, 10), match.groups()[1:], strict=True) if d)
        value = int(digits, base) * (-1 if match[1] == "-" else 1)
        if -(2**63) <= value < 2**63 or (not match[1] and value <= INT_MAX):
            return value
    if _YAML_STYLE_FLOAT.fullmatch(plain):
        value = float(plain)
        return value if math.isfinite(value) else text  # Go's ParseFloat refuses what overflows
    return text


def pyyaml_value(text: str) -> object:
    """What PyYAML's SafeLoader (YAML 1.1) reads a plain scalar as."""
    tag = _PYYAML.resolve(yaml.ScalarNode, text, (True, False))
    try:
        return _PYYAML.construct_object(yaml.ScalarNode(tag, text))
    except (yaml.YAMLError, ValueError):
        return text


_PYYAML = yaml.SafeLoader("")


def _described(value: object) -> str:
    if isinstance(value, str):
        return f"the text {_short(value)!r}"
    if isinstance(value, bool) or value is None:
        return f"the value {value}"
    kind = "whole number" if isinstance(value, int) else "float"
    return f"the {kind} {value!r}" if len(repr(value)) <= 40 else f"a {kind} of {len(repr(value))} digits"


def _short(text: str) -> str:
    """The scalar as a message quotes it: escaped, at most 40 characters."""
    shown = ascii(text)[1:-1]
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def pulumi_key(key: object) -> object:
    """A map key as Pulumi's config hands it to the program: a plain decimal integer key (the
    only non-text key structure_problems lets through) as its Go `%v` text, `3` -> "3"
    (object.go:505-510)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    return key


def first_difference(ours: object, theirs: object, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """The first path where two JSON-like values differ (types compared strictly: 1, 1.0 and
    True are three values), or None when they are the same."""
    if type(ours) is not type(theirs):
        return path
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs), key=str):
            if key not in ours or key not in theirs:
                return (*path, key)
            found = first_difference(ours[key], theirs[key], (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(ours, list) and isinstance(theirs, list):
        for index, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
            found = first_difference(mine, other, (*path, index))
            if found is not None:
                return found
        return None if len(ours) == len(theirs) else (*path, min(len(ours), len(theirs)))
    return None if ours == theirs else path
