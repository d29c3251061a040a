"""Operators' SSH keys are judged as keys (kilonode.config.keys, catalog/ssh_keys.yaml): keys that
ssh-keygen makes pass, the edges of what OpenSSH and FIPS 186-4 allow pass, and every point of small
order on Ed25519 is refused. The degenerate keys themselves are hostile files (sem-key-*)."""

from __future__ import annotations

import base64
import random
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from kilonode.config.keys import P, ed25519_point, ed25519_problem, rsa_problem
from kilonode.config.values import _ssh_public_key

SMALL_ORDER_SEED = 37


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _mpint(n: int) -> bytes:
    return _field(n.to_bytes((n.bit_length() + 8) // 8, "big"))


def rsa_line(e: int, n: int) -> str:
    return "ssh-rsa " + base64.b64encode(_field(b"ssh-rsa") + _mpint(e) + _mpint(n)).decode() + " a@example.com"


def ed25519_line(raw: bytes) -> str:
    return "ssh-ed25519 " + base64.b64encode(_field(b"ssh-ed25519") + _field(raw)).decode() + " a@example.com"


def openssh(public_key: ed25519.Ed25519PublicKey | rsa.RSAPublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


@pytest.mark.parametrize("make", [
    lambda: ed25519.Ed25519PrivateKey.generate().public_key(),
    lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(),
], ids=["ed25519", "rsa-2048"])
def test_keys_as_ssh_keygen_makes_them_pass(make: object) -> None:
    for _ in range(2):
        line = openssh(make()) + " alice@example.com"  # type: ignore[operator]
        assert _ssh_public_key(line) == line


def _odd_without_small_factors(bits: int) -> int:
    rng = random.Random(bits)
    while True:
        n = rng.getrandbits(bits) | (1 << (bits - 1)) | 1
        if all(n % p for p in range(3, 10_000, 2)):
            return n


def test_the_largest_modulus_openssh_reads_passes_and_one_bit_more_is_refused() -> None:
    assert rsa_problem(65537, _odd_without_small_factors(16384)) is None
    assert "more than OpenSSH reads" in (rsa_problem(65537, _odd_without_small_factors(16385)) or "")


@pytest.mark.parametrize(("e", "refused"), [
    (65537, False), (2**256 - 1, False), (65539, False),
    (65535, True), (2**256 + 1, True), (2**16, True),
])
def test_the_exponent_fips_186_4_allows_is_the_one_that_passes(e: int, refused: bool, modulus: int) -> None:
    n = modulus
    assert (rsa_problem(e, n) is not None) is refused


@pytest.fixture(scope="module")
def modulus() -> int:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_numbers().n


def _encode(point: tuple[int, int]) -> bytes:
    x, y = point
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _small_order_points() -> set[tuple[int, int]]:
    """The eight points of order dividing 8: [L]Q of a random point Q generates them."""
    from kilonode.config.keys import L, _times
    rng = random.Random(SMALL_ORDER_SEED)
    while True:
        point = ed25519_point(rng.randrange(P).to_bytes(32, "little"))
        if point is None:
            continue
        torsion = _times(point, L)
        points = {_times(torsion, k) for k in range(8)}
        if len(points) == 8:
            return points


def test_every_point_of_small_order_is_refused_in_every_spelling() -> None:
    points = _small_order_points()
    assert len(points) == 8
    for point in points:
        raw = _encode(point)
        assert ed25519_problem(raw) is not None, point
        with pytest.raises(ValueError, match=r"small order|not a point"):
            _ssh_public_key(ed25519_line(raw))


def test_a_real_key_is_not_mistaken_for_a_degenerate_one() -> None:
    for _ in range(20):
        raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        assert ed25519_problem(raw) is None


def test_a_negative_rsa_number_is_refused(modulus: int) -> None:
    blob = _field(b"ssh-rsa") + _mpint(65537) + _field(modulus.to_bytes(256, "big"))  # high bit set, no leading zero
    with pytest.raises(ValueError, match="negative"):
        _ssh_public_key("ssh-rsa " + base64.b64encode(blob).decode())
