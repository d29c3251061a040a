"""The shared sha256 and YAML helpers (kilonode.digest, kilonode.yamlio)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from kilonode.digest import CHUNK, sha256_bytes, sha256_file, sha256_text
from kilonode.yamlio import block_yaml, flow_yaml, plain_yaml, roundtrip_dump, roundtrip_yaml


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
    assert block_yaml(data, width=None, fast=True) == block_yaml(data)
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
