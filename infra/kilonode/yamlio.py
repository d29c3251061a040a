"""Every YAML kilonode writes, with the options each kind needs, in one place.

- `block_yaml`: files people read in diffs (rendered configs, goldens, cloud-config parts):
  key order kept, block style, multi-line strings as literal blocks.
- `plain_yaml`: documents a program reads (kubeconfigs, component configs): PyYAML's safe
  dump, key order kept.
- `flow_yaml`: one value on one line (the stack reference's defaults).
- `roundtrip_yaml`: the stack file's own round-trip reader and writer, which keeps its
  comments, quotes and layout (`kilonode allocate` records values in it).
- `load_yaml`, `load_yaml_all`: every document kilonode reads (its own renders, catalogue files,
  recorded graphs' files), on libyaml's safe loader where PyYAML has it.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from ruamel.yaml import YAML

READABLE_WIDTH = 100  # where PyYAML folds long plain strings in block_yaml's output


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


# libyaml's emitter where PyYAML was built with it (PyPI's wheels are): its output is the pure-
# Python emitter's byte for byte (the goldens are the check, and tests/test_digest_yamlio.py's
# property tests for all three dumps), at a sixth of the time, and a big cluster's render is many
# dumps (one per host, its custom data, the plan).
_SafeDumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


# libyaml's parser with PyYAML's safe constructor (the same Python objects as yaml.safe_load, the
# same refusals of unsafe tags), several times faster on the rendered files preflight and the
# review read many times over (a kubelet config per pool role, every unit and cloud-config).
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str | bytes) -> Any:
    """yaml.safe_load's answer, on libyaml where present."""
    return yaml.load(text, Loader=_SafeLoader)


def load_yaml_all(text: str | bytes) -> Any:
    """yaml.safe_load_all's documents (a generator), on libyaml where present."""
    return yaml.load_all(text, Loader=_SafeLoader)


class _BlockDumper(_SafeDumper):  # type: ignore[valid-type,misc]
    """Multi-line strings as literal blocks, so embedded files stay readable in diffs."""


_BlockDumper.add_representer(str, _str)


def block_yaml(data: Any, width: int | None = READABLE_WIDTH) -> str:
    """Block style, key order kept, multi-line strings as `|` blocks. `width=None` is
    PyYAML's own default (80)."""
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=width)


def plain_yaml(data: Any) -> str:
    """PyYAML's safe dump, key order kept, on libyaml's emitter like block_yaml."""
    return yaml.dump(data, Dumper=_SafeDumper, sort_keys=False)


def flow_yaml(data: Any) -> str:
    """`data` on one line in flow style (no document end marker): `{a: 1, b: [x, y]}`."""
    text = yaml.dump(data, Dumper=_SafeDumper, default_flow_style=True, width=10_000)
    return text.strip().removesuffix("...").strip()


def roundtrip_yaml() -> YAML:
    """ruamel's round-trip YAML in the stacks' style: comments, key order, flow maps and
    quotes survive; "  - name: x" indentation. Imported here: only `allocate` needs it."""
    from ruamel.yaml import YAML

    document_yaml = YAML()
    document_yaml.preserve_quotes = True
    document_yaml.width = 4096
    document_yaml.indent(mapping=2, sequence=4, offset=2)
    return document_yaml


def roundtrip_dump(document_yaml: YAML, document: Any) -> str:
    buffer = io.StringIO()
    document_yaml.dump(document, buffer)
    return buffer.getvalue()
