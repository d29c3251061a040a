"""The shared sha256 and YAML helpers (kilonode.digest, kilonode.yamlio)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kilonode import yamlio
from kilonode.digest import CHUNK, sha256_bytes, sha256_file, sha256_text
from kilonode.yamlio import block_yaml, flow_yaml, plain_yaml, roundtrip_dump, roundtrip_yaml

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def test_the_three_digests_agree_with_hashlib(tmp_path: Path) -> None:
    text = "naïve\n" * 10
    data = text.encode()
    big = tmp_path / "big"
    big.write_bytes(data * (CHUNK // len(data) + 3))  # more than one chunk
    assert sha256_text(text) == sha256_bytes(data) == hashlib.sha256(data).hexdigest()
    assert sha256_file(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_block_yaml_keeps_order_and_writes_multiline_strings_as_blocks() -> None:
    data = {"z": 1, "a": "one\ntwo\n", "m": ["x"]}
    assert block_yaml(data) == "z: 1\na: |\n  one\n  two\nm:\n- x\n"
    assert yaml.safe_load(block_yaml(data)) == data


def test_block_yaml_folds_at_its_width() -> None:
    long = " ".join(["word"] * 30)  # 149 characters
    assert len(block_yaml({"k": long}).splitlines()) == 2  # folded once at 100
    assert len(block_yaml({"k": long}, width=None).splitlines()) == 2  # and at PyYAML's 80
    assert len(block_yaml({"k": long}, width=200).splitlines()) == 1


def test_plain_and_flow_yaml() -> None:
    data = {"b": "one\ntwo", "a": 1}
    assert plain_yaml(data).endswith("a: 1\n") and "|" not in plain_yaml(data)  # no literal blocks
    assert yaml.safe_load(plain_yaml(data)) == data
    assert flow_yaml({"a": [1, 2], "b": "x"}) == "{a: [1, 2], b: x}"
    assert flow_yaml(None) == "null"


def test_the_round_trip_keeps_comments_and_layout() -> None:
    source = "config:\n  # why\n  pools:\n    - name: a  # first\n      nodes: 'x'\n"
    document_yaml = roundtrip_yaml()
    assert roundtrip_dump(document_yaml, document_yaml.load(source)) == source


class _PythonBlockDumper(yaml.SafeDumper):
    """block_yaml's dumper on PyYAML's pure-Python emitter, the reference libyaml's must match."""


_PythonBlockDumper.add_representer(str, yamlio._str)
# Text as kilonode writes it: printable ASCII with newlines and tabs (a non-ASCII character is
# escaped, and the emitters fold such an escaped string at different places; the goldens hold
# every string kilonode really writes).
TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("\n\t"), max_size=160)
# keys as kilonode writes them (field names, paths, labels); the emitters differ on an empty key
KEYS = st.from_regex(r"[A-Za-z/][A-Za-z0-9_./-]{0,30}", fullmatch=True)
DOCUMENTS = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                         max_leaves=12)


# What block_yaml writes: a mapping or a list at the top (for a bare scalar the emitters differ:
# the Python one ends the document with "...", libyaml does not).
FILES = st.dictionaries(KEYS, DOCUMENTS, min_size=1, max_size=5) | st.lists(DOCUMENTS, min_size=1, max_size=5)


# 50 drawn afresh each run (the fast suite runs often); the goldens hold what kilonode itself writes
@settings(max_examples=50, deadline=None)
@given(FILES, st.sampled_from([yamlio.READABLE_WIDTH, None]))
def test_libyaml_writes_what_the_python_emitter_writes(data: object, width: int | None) -> None:
    python = yaml.dump(data, Dumper=_PythonBlockDumper, sort_keys=False, default_flow_style=False, width=width)
    # After a document ending in a literal block that keeps its trailing newlines (`|+`) the
    # emitters do not always agree on the optional document-end marker "...": no content.
    assert block_yaml(data, width=width).removesuffix("...\n") == python.removesuffix("...\n")


@settings(max_examples=50, deadline=None)
@given(FILES)
def test_plain_yaml_on_libyaml_writes_what_pyyamls_safe_dump_writes(data: object) -> None:
    # the kubeconfigs and component configs: plain_yaml was yaml.safe_dump before it took libyaml
    assert plain_yaml(data).removesuffix("...\n") == yaml.safe_dump(data, sort_keys=False).removesuffix("...\n")


@settings(max_examples=50, deadline=None)
@given(DOCUMENTS)
def test_flow_yaml_on_libyaml_writes_what_pyyamls_safe_dump_writes(data: object) -> None:
    # the stack reference's defaults, one value on a line, scalars included
    python = yaml.safe_dump(data, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    assert flow_yaml(data) == python
