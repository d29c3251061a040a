"""custom-data-size: every machine's custom data fits Azure's limit; the certificate sizes it
models bound the real ones; seeded breaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from kilonode.azure import custom_data_size
from kilonode.azure.custom_data import AZURE_CUSTOM_DATA_MAX_BYTES
from kilonode.local import pki as local_pki
from kilonode.plan import pki
from kilonode.preflight import Finding, run
from kilonode.preflight.checks import custom_data_size as size_check
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

HOST = "etcd-events-0"


def findings(stack: str, files: dict[str, str] | None = None) -> list[Finding]:
    return run(inputs_of(stack, files=files), [size_check.NAME])


def with_file(files: dict[str, str], host: str, size: int) -> dict[str, str]:
    """`host`'s user-data with one more write_files entry of `size` bytes."""
    document = shared.load_yaml(files[f"{host}/user-data"])
    document["write_files"].append({"path": "/usr/local/lib/kilonode/big", "content": "x" * size,
                                    "permissions": "0644"})
    files[f"{host}/user-data"] = "#cloud-config\n" + yaml.safe_dump(document, width=1 << 20)
    return files


def test_the_shipped_stacks_fit_with_room_to_spare(shipped: str) -> None:
    assert findings(shipped) == []


def test_a_host_over_the_limit_is_a_break_naming_its_size_and_largest_file() -> None:
    files, _ = artefacts("research-7500")
    [found] = findings("research-7500", with_file(files, HOST, 30_000))
    assert (found.level, found.where) == ("break", HOST)
    size = int(found.what.split(" bytes")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert size > AZURE_CUSTOM_DATA_MAX_BYTES
    assert f"{size - AZURE_CUSTOM_DATA_MAX_BYTES:,} over the 65,535" in found.what
    assert "Its largest files: /usr/local/lib/kilonode/big (30,000 B)" in found.what
    assert "kilonode/node/ship.py" in found.fix


def test_a_host_close_to_the_limit_is_a_warning_with_its_headroom() -> None:
    files, _ = artefacts("research-7500")
    # etcd-events-0 takes about 32.4 KB: 23,000 bytes more of text are about 30.7 KB more of base64
    [found] = findings("research-7500", with_file(files, HOST, 23_000))
    assert (found.level, found.where) == ("warn", HOST)
    room = int(found.what.split(" below")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert 0 <= room < size_check.HEADROOM_WARN_BYTES
    assert f"{room:,} below the 65,535 kilonode.azure.custom_data allows" in found.what


def test_a_pools_scale_sets_are_measured_with_its_node_files() -> None:
    files, _ = artefacts("local")
    [found] = findings("local", with_file(files, "pool-cpu", 40_000))
    assert (found.level, found.where) == ("break", "pool-cpu")


def test_the_modelled_pems_bound_every_real_certificate_and_key_of_the_shipped_stacks(
    shipped: str, tmp_path: Path
) -> None:
    """Against the local issuer (built as pulumi-tls builds them): a certificate's modelled DER is
    never below the real one and at most 40 bytes above; the keys' PEMs are exactly the sizes."""
    layout, _ = local_pki.issue_plan(shared.plan(shipped), tmp_path)
    where = local_pki.LocalPki(tmp_path)
    for item in (*layout.authorities, *layout.leaves):
        kind = layout.kind(item.name)
        real = x509.load_pem_x509_certificate(where.cert(item.name, kind).read_bytes())
        der = len(real.public_bytes(Encoding.DER))
        modelled = custom_data_size.certificate_pem(layout, item.name)
        assert der <= custom_data_size._certificate_der(layout, item.name) <= der + 40, item.name
        assert len(modelled) >= len(where.cert(item.name, kind).read_text()), item.name
    key = where.key(layout.leaves[0].name, "leaf").read_text()
    assert len(custom_data_size.pem("EC PRIVATE KEY", custom_data_size.PRIVATE_KEY_DER_BYTES)) == len(key) == 227
    public = where.public_key(pki.SERVICE_ACCOUNT).read_text()
    assert len(custom_data_size.pem("PUBLIC KEY", custom_data_size.PUBLIC_KEY_DER_BYTES)) == len(public) == 178


@pytest.mark.parametrize("der_bytes", [91, 121, 450, 616])
def test_a_modelled_pem_is_shaped_as_a_real_one(der_bytes: int) -> None:
    text = custom_data_size.pem("CERTIFICATE", der_bytes)
    lines = text.splitlines()
    assert lines[0] == "-----BEGIN CERTIFICATE-----" and lines[-1] == "-----END CERTIFICATE-----"
    assert all(len(line) == 64 for line in lines[1:-2]) and 0 < len(lines[-2]) <= 64
