"""custom-data-size: every machine's custom data, as Azure receives it, fits the 65,535 bytes
kilonode.azure.custom_data allows.

Each etcd member and apiserver VM, and each pool's scale sets (one custom data per registration
group: the pool's shared shards, each team's), gets one cloud-init document
(kilonode.azure.custom_data): the role's rendered `user-data`, then a part whose `write_files`
carries what Pulumi creates. For an etcd member: its cluster's CA and client CA bundle, its
server and peer certificates and keys, and the snapshot upload's Azure config; for an
apiserver: the Kubernetes CA and its key, its serving, etcd client, kubelet client, scheduler
and controller manager serving certificates and keys, the service-account key pair, the etcd
CA bundle, a kubeconfig with an embedded client certificate per co-located component, and the
Secrets' EncryptionConfiguration; for a pool: the Kubernetes CA and the bootstrap kubeconfig
with the pool's join token. The check composes each the way the program does (the same
compose_mime and base64) and measures it (kilonode.azure.custom_data_size, which the program and
every command that plans use to refuse a stack whose custom data would be over).

The recorded graph and a render hold no real PEM (the mock engine's placeholders are a few
bytes), so each is replaced by one of the size a real one has: ECDSA P-256
(kilonode.plan.pki), a private key as pulumi-tls writes it (SEC1 "EC PRIVATE KEY", 121 bytes of
DER: 227 bytes of PEM), a public key (SubjectPublicKeyInfo, 91 bytes: 178), and a certificate
of CERT_DER_OVERHEAD bytes plus its names (subject, issuer, SANs, extended key usages), an
upper bound that tests/preflight/test_custom_data_size.py holds against every certificate the
local issuer (kilonode.local.pki, built as pulumi-tls builds them) makes for the shipped stacks.
The Azure values (the backup account's blob endpoint, a client ID, an age recipient, a 32-byte
Secrets key) are written at their real lengths.

With the local issuer's real certificates (tests/azure/test_tls_and_custom_data.py), the largest
host of each kind at research-7500 takes 51.9 KB of the 65,535 base64 bytes (the apiservers),
36.1 KB (the h100-ib pool), 32.2 KB (etcd-events members) and 31.3 KB (etcd-main); this check's
estimate is never below the real size and at most 2 % above it (52.7 KB for those apiservers).
While the etcd members carried the snapshot and certificate expiry programs inline, theirs was
66.5 and 67.4 KB: over.

Levels: above the limit is a `break`: `pulumi up` and `preview` stop in the program when it
composes that host's custom data (kilonode.azure.custom_data.encode refuses it); Azure itself
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
