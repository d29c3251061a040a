"""What an operator's SSH public key must be beyond well-formed (ssh_keys.yaml)."""

from __future__ import annotations

from functools import cache

from kilonode.catalog import CATALOG_DIR, Row, load


class Types(Row):
    value: tuple[str, ...]
    source: str


class Figure(Row):
    value: int
    source: str


class Exponent(Row):
    min: int
    max_bits: int
    source: str


class SshKeyRules(Row):
    types: Types
    rsa_min_bits: Figure
    rsa_max_bits: Figure
    rsa_exponent: Exponent
    rsa_prime_distance: Figure


@cache
def ssh_key_rules() -> SshKeyRules:
    return load(SshKeyRules, CATALOG_DIR / "ssh_keys.yaml")
