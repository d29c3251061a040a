"""cloud-init's own code reads our custom data: the TLS part merges into the rendered config.

Uses Debian's cloud-init (unpacked by tests/render/consumers.py): its multipart processor
and its cloud-config part handler, the code that runs on the VM at first boot.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import yaml

from kilonode.azure import custom_data
from kilonode.azure.graph import Graph
from kilonode.plan import wellknown
from kilonode.render import USER_DATA
from tests import shared
from tests.render.consumers import cloud_init_validator, import_cloud_init

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def merge() -> Any:
    """merge(custom data, base64) -> the cloud-config cloud-init builds from all its parts."""
    import_cloud_init()
    from cloudinit import handlers, helpers
    from cloudinit import user_data as ud
    from cloudinit.handlers.cloud_config import CloudConfigPartHandler

    def run(encoded: str) -> dict[str, Any]:
        paths = helpers.Paths({"cloud_dir": tempfile.mkdtemp()})
        message = ud.UserDataProcessor(paths).process(custom_data.decode(encoded))
        handler = CloudConfigPartHandler(paths)
        handler.handle_part(None, handlers.CONTENT_START, None, None, None, None)
        for part in message.walk():
            if part.get_content_maintype() == "multipart":
                continue
            assert part.get_content_type() == "text/cloud-config"
            body = part.get_payload(decode=True).decode()
            handler.handle_part(None, part.get_content_type(), part.get_filename(), body, None, dict(part.items()))
        return dict(handler.cloud_buf)

    return run


@pytest.fixture(scope="module")
def validate() -> Any:
    return cloud_init_validator()


# a pool's scale sets: a shared one (the pool's files) and one of team language's (its own)
POOL_SHARDS = {"pool-a100-ib": "research-7500-a100-ib-049", "pool-a100-ib.team-language": "research-7500-a100-ib-000"}


@pytest.mark.parametrize("host", ["etcd-main-0", "etcd-events-1", "apiserver-0", *POOL_SHARDS])
def test_cloud_init_keeps_every_rendered_file_and_command_and_adds_the_tls_files(
    graph_7500: Graph, merge: Any, validate: Any, host: str
) -> None:
    rendered = yaml.safe_load(shared.rendered("research-7500")[host][USER_DATA].content)
    if host.startswith("pool-"):
        vmss = graph_7500.named(POOL_SHARDS[host]).plain()
        encoded = vmss["virtualMachineProfile"]["osProfile"]["customData"]
    else:
        role, index = host.rsplit("-", 1)
        encoded = graph_7500.named(f"research-7500-{role}-{index}").plain()["osProfile"]["customData"]
    merged = merge(encoded)
    rendered_files = rendered["write_files"]
    assert merged["write_files"][: len(rendered_files)] == rendered_files
    added = {f["path"] for f in merged["write_files"][len(rendered_files):]}
    assert wellknown.K8S_CA in added if host.startswith(("apiserver", "pool")) else wellknown.ETCD_SERVER_KEY in added
    assert merged["runcmd"] == rendered["runcmd"]
    assert "merge_how" not in merged
    assert validate(merged) == []
