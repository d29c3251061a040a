"""custom-data-size: every machine's custom data, as Azure receives it, fits the 65,535 bytes
kilonode.azure.custom_data allows.

Each etcd member and apiserver VM, and each pool's scale sets (one custom data per registration
group), gets one cloud-init document: the role's rendered `user-data`, then a part whose
`write_files` carries what Pulumi creates. What each carries, and the real-size model of every
certificate, key and Azure value in it, is kilonode.azure.custom_data_size's (its docstring): the
program, every command that plans and this check measure with it, the same compose_mime and base64.

With the local issuer's real certificates (tests/azure/test_tls_and_custom_data.py) this check's
estimate is never below the real size and at most 2 % above it. Its estimates at research-7500
(2026-12-07): 55.4 KB of the 65,535 base64 bytes for the apiservers, 40.8 KB for the h100-ib pool,
32.8 KB for etcd-events members and 31.8 KB for etcd-main.
While the etcd members carried the snapshot and certificate expiry programs inline, theirs was
66.5 and 67.4 KB: over.

Levels: above the limit is a `break`: the program refuses the stack before it creates anything
(kilonode.azure.custom_data_size.refuse_oversized), as every command that plans does; Azure itself
refuses a custom data above 65,535 decoded bytes, 87,380 base64 characters ("Custom data in
OSProfile must be in Base64 encoding and with a maximum length of 87380 characters"). Less
than 8 KiB below it (HEADROOM_WARN_BYTES: two more component kubeconfigs) is a `warn`: the
next files a host is given stop the update. Each finding names the host's largest files.
"""

from __future__ import annotations

from kilonode.azure.custom_data import AZURE_CUSTOM_DATA_MAX_BYTES
from kilonode.azure.custom_data_size import delivered, encoded_size, largest_files
from kilonode.plan import pki
from kilonode.preflight.model import Finding, Inputs
from kilonode.render.files import USER_DATA

NAME = "custom-data-size"
TITLE = "every VM's and scale set's custom data, with certificates of real size, fits Azure's 64 KiB"

# Below the limit by less than this: a warning. Room for two more kubeconfigs with an embedded
# client certificate (each takes 3.5 KB of an apiserver's custom data once delivered: the GPU
# health controller's is the one a stack adds with its first GPU pool) and a little more.
HEADROOM_WARN_BYTES = 8 * 1024


def _machines(inputs: Inputs, layout: pki.PkiLayout) -> list[str]:
    """The render roles that are a VM's or a scale set's custom data."""
    pools = {role for p in inputs.plan.node_pools for role in (p.role(), *(p.role(t) for t in p.teams))}
    return [h for h in inputs.hosts() if (h in layout.hosts or h in pools) and USER_DATA in inputs.host_files(h)]


def check(inputs: Inputs) -> list[Finding]:
    layout = pki.pki_layout(inputs.plan)
    findings = []
    for host in _machines(inputs, layout):
        user_data = inputs.host_files(host)[USER_DATA]
        files = delivered(inputs.plan, layout, host)
        size = encoded_size(user_data, files)
        room = AZURE_CUSTOM_DATA_MAX_BYTES - size
        if room >= HEADROOM_WARN_BYTES:
            continue
        largest = largest_files(user_data, files)
        if room < 0:
            findings.append(Finding(
                NAME, "break", host,
                f"its custom data is {size:,} bytes base64-encoded, {-room:,} over the {AZURE_CUSTOM_DATA_MAX_BYTES:,} "
                "kilonode.azure.custom_data allows: `pulumi up` stops when the program composes it, and no VM of this "
                f"role is created or updated. Its largest files: {largest}",
                "move what makes it large out of the custom data: a program into the images (its row in "
                "kilonode/node/ship.py), a fixed file into the recipe's overlays (node-image/)"))
        else:
            findings.append(Finding(
                NAME, "warn", host,
                f"its custom data is {size:,} bytes base64-encoded, {room:,} below the {AZURE_CUSTOM_DATA_MAX_BYTES:,} "
                f"kilonode.azure.custom_data allows (less than {HEADROOM_WARN_BYTES:,}): the next file it is given may "
                f"stop `pulumi up`. Its largest files: {largest}",
                "move what does not differ per host into the images (kilonode/node/ship.py, node-image/)"))
    return findings
