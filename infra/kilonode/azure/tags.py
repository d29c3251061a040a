"""Tags the policy pack and `kilonode diff` read (kilonode.review.rules): plain strings, no
Pulumi import, so the review's own process starts fast."""

from __future__ import annotations

# The etcd quota on each member's VM, where `pulumi preview --policy-pack policy/` can read it
# (custom data is unknown at preview and secret): kilonode.review.rules checks it. Above
# etcd's suggested maximum (8 GiB) the stack file had to acknowledge it, and the tag says so.
ETCD_QUOTA_TAG = "kilonode-etcd-quota-bytes"
ETCD_QUOTA_ACKNOWLEDGED_TAG = "kilonode-etcd-quota-acknowledged"
# On a control-plane public IP: the stack file asked for it (network.publicIpsOnControlPlane).
PUBLIC_IP_ACKNOWLEDGED_TAG = "kilonode-public-ip-acknowledged"
SUGGESTED_MAX_QUOTA_BYTES = 8 << 30  # etcd's documented suggested maximum


def quota_tags(quota_backend_bytes: int) -> dict[str, str]:
    found = {ETCD_QUOTA_TAG: str(quota_backend_bytes)}
    if quota_backend_bytes > SUGGESTED_MAX_QUOTA_BYTES:
        found[ETCD_QUOTA_ACKNOWLEDGED_TAG] = "true"
    return found
