"""Operators' SSH public keys, judged as keys rather than as text: a well-formed key whose
numbers let anyone sign for it (an RSA exponent of 1, a modulus with a small or a repeated
prime, an Ed25519 point of small order) is refused. The rules with their sources are in
catalog/ssh_keys.yaml; the key is parsed by `cryptography`, as OpenSSH would read it.

Ed25519: RFC 8032, section 5.1.3 decodes a point (y below p, x from the curve equation, x = 0
only with a clear sign bit); ssh-keygen's public key is [s]B, a multiple of the base point B of
prime order L, so [L]A is the identity. A point of small order (the eight points of order 1, 2,
4 or 8: the all-zero key is one) or with a small-order component fails that, and a signature
check against it proves nothing (RFC 8032 section 5.1.7 verifies [8][S]B = [8]R + [8][k]A, which
such a component cannot change).
"""

from __future__ import annotations

from math import isqrt

from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from kilonode.catalog.ssh_keys import ssh_key_rules

# RFC 8032, section 5.1: the field, the curve constant d, the order of the base point
P = 2**255 - 19
D = (-121665 * pow(121666, -1, P)) % P
L = 2**252 + 27742317777372353535851937790883648493
SQRT_M1 = pow(2, (P - 1) // 4, P)
IDENTITY = (0, 1)
# primes below this divide no honest modulus: trial division finds a degenerate one at once
SMALL_PRIME_BOUND = 10_000


def _small_primes() -> list[int]:
    sieve = bytearray([1]) * SMALL_PRIME_BOUND
    sieve[:2] = b"\0\0"
    for i in range(2, isqrt(SMALL_PRIME_BOUND) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(sieve[i * i::i]))
    return [i for i, prime in enumerate(sieve) if prime]


def ed25519_point(raw: bytes) -> tuple[int, int] | None:
    """The point a 32-byte Ed25519 public key encodes (RFC 8032, section 5.1.3), or None."""
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    sign = raw[31] >> 7
    if y >= P:
        return None
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x = (u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P)) % P
    if (v * x * x - u) % P:
        x = x * SQRT_M1 % P
        if (v * x * x - u) % P:
            return None
    if x == 0 and sign:
        return None
    return (P - x, y) if x & 1 != sign else (x, y)


Extended = tuple[int, int, int, int]  # (X, Y, Z, T): x = X/Z, y = Y/Z, T = XY/Z
EXTENDED_IDENTITY: Extended = (0, 1, 1, 0)


def _add(a: Extended, b: Extended) -> Extended:
    # RFC 8032, section 5.1.4 (a = -1): complete, since d is not a square mod p
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa, bb = (y1 - x1) * (y2 - x2) % P, (y1 + x1) * (y2 + x2) % P
    cc, dd = 2 * t1 * t2 * D % P, 2 * z1 * z2 % P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return e * f % P, g * h % P, f * g % P, e * h % P


def _times(point: tuple[int, int], n: int) -> tuple[int, int]:
    """[n]point, in affine coordinates."""
    result, step = EXTENDED_IDENTITY, (point[0], point[1], 1, point[0] * point[1] % P)
    while n:
        if n & 1:
            result = _add(result, step)
        step, n = _add(step, step), n >> 1
    inverse = pow(result[2], -1, P)
    return result[0] * inverse % P, result[1] * inverse % P


def ed25519_problem(raw: bytes) -> str | None:
    """Why a 32-byte Ed25519 public key is no key anyone holds alone, if it is not."""
    point = ed25519_point(raw)
    if point is None:
        return "its 32 bytes are not a point of Ed25519 (RFC 8032, section 5.1.3: no x for that y, or y ≥ p)"
    if _times(point, 8) == IDENTITY:
        return ("it is a point of small order (the all-zero key is one): a signature check against it proves "
                "nothing, so anyone could log in")
    if _times(point, L) != IDENTITY:
        return ("it is not in Ed25519's prime-order group (it carries a small-order part), which no key "
                "ssh-keygen makes holds")
    return None


def rsa_problem(e: int, n: int) -> str | None:
    """Why an RSA public key (exponent, modulus) is too weak or degenerate to trust, if it is."""
    rules = ssh_key_rules()
    bits = n.bit_length()
    if bits < rules.rsa_min_bits.value:
        return (f"an RSA key of {bits} bits; Azure takes RSA keys of at least {rules.rsa_min_bits.value} bits "
                f"({rules.rsa_min_bits.source}); make an ssh-ed25519 key")
    if bits > rules.rsa_max_bits.value:
        return f"an RSA key of {bits} bits, more than OpenSSH reads ({rules.rsa_max_bits.source})"
    exponent = rules.rsa_exponent
    if e % 2 == 0 or e < exponent.min or e.bit_length() > exponent.max_bits:
        return (f"its RSA exponent {e if e < 2**64 else f'of {e.bit_length()} bits'} is no public exponent: it "
                f"must be odd, at least {exponent.min} and below 2^{exponent.max_bits} ({exponent.source})")
    factor = next((p for p in _small_primes() if n % p == 0), None)
    if factor is not None:
        return f"its RSA modulus is divisible by {factor}: anyone can factor it and sign as its owner"
    root = isqrt(n)
    if root * root == n:
        return "its RSA modulus is a square (its two primes are one): anyone can factor it"
    a = root + 1
    for _ in range(rules.rsa_prime_distance.value):
        b = isqrt(a * a - n)
        if b * b == a * a - n:
            return ("its RSA modulus' two primes are so close that Fermat's method factors it at once "
                    f"({rules.rsa_prime_distance.source})")
        a += 1
    return None


def parsed_problem(line: str, kind: str) -> str | None:
    """Read the key line as `cryptography` (and so OpenSSH) reads it; why it cannot be, or is another key."""
    try:
        key = load_ssh_public_key(line.encode("ascii"))
    except (ValueError, TypeError):
        return "cryptography cannot read it as an OpenSSH public key: make it with ssh-keygen"
    wanted = {"ssh-ed25519": ed25519.Ed25519PublicKey, "ssh-rsa": rsa.RSAPublicKey}[kind]
    return None if isinstance(key, wanted) else f"cryptography reads it as another kind of key than {kind}"
