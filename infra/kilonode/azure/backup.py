"""EtcdBackup: where the etcd members' scheduled snapshots go in Azure, and who may write there.

A storage account of the cluster's own, a container for both etcd clusters' snapshots (each
under its prefix, main/ and events/: kilonode.render.etcd_snapshot), a lifecycle rule that
deletes them after defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS, and a user-assigned identity
for the etcd VMs with "Storage Blob Data Contributor" on that one container, nothing wider.
The snapshot script on each member asks the instance metadata service for a token of this
identity and writes with the Blob REST API; it needs the account's blob endpoint, the container
and the identity's client ID, which Azure knows only once it created them: `host_file()` is
that file, for the program to deliver beside the TLS files (custom data).

Snapshots leave the member encrypted with `age` (kilonode.node.etcd_snapshot): the members hold
only the recipient (a public X25519 key), so no VM can read back what was uploaded; the
identity that decrypts is random bytes Pulumi keeps as a secret, exported as the stack output
`etcdSnapshotIdentity` for the restore (docs/runbooks/etcd-restore-from-snapshot.md).

The account takes no anonymous access, no shared keys (only Microsoft Entra tokens, so no
account key exists that could leak), HTTPS with TLS 1.2 or later only; zone-redundant where
the region has availability zones, so the copies outlive the zone that may have taken the
etcd members with it. Its network rules deny every source but two: the etcd subnet (a
`Microsoft.Storage` service endpoint on it, kilonode.azure.network, and a virtual network rule
here: the members write from private addresses, which IP rules never match) and the deployer's
public addresses (`deployer.cidrs`, kilonode.azure.common.storage_ip_rules), where the restore
runbook reads snapshots back. No Azure service reads this account: no bypass.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_random as random
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pulumi_azure_native import managedidentity, storage

from kilonode.azure.common import storage_network_rules, tags
from kilonode.azure.custom_data import DeliveredFile
from kilonode.azure.identity import assign_role, role_definition_id, subscription_of
from kilonode.plan import defaults
from kilonode.plan.azure_names import storage_account_name

# Azure built-in role "Storage Blob Data Contributor": read, write and delete blobs and
# containers (Microsoft's "Azure built-in roles" reference; the same GUID in every tenant).
# Delete is needed by nothing here, but the narrower built-in roles cannot write at all.
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
# A storage account's lifecycle management policy is always named "default" (the SDK's
# ManagementPolicyArgs.management_policy_name: "It should always be 'default'").
MANAGEMENT_POLICY_NAME = "default"
ROLE = "etcd-backup"
STORAGE_TAG = "etcdbk"  # kilonode.plan.azure_names.STORAGE_TAGS


# age's X25519 keys (C2SP age.md, "The X25519 recipient type"; FiloSottile/age v1.1.1, the
# version Debian bookworm ships): the recipient is Bech32 with HRP "age" of the public key, the
# identity Bech32 with HRP "AGE-SECRET-KEY-" of the 32-byte scalar, upper-cased.
AGE_KEY_BYTES = 32
_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def _bech32_polymod(values: list[int]) -> int:
    """BIP 173's checksum (plain Bech32, constant 1: what age uses, not Bech32m)."""
    generator = [0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3]
    check = 1
    for value in values:
        top = check >> 25
        check = (check & 0x1FFFFFF) << 5 ^ value
        for i in range(5):
            check ^= generator[i] if (top >> i) & 1 else 0
    return check


def bech32(hrp: str, data: bytes) -> str:
    """Bech32 of `data` under `hrp` (lower case); age puts no limit of 90 characters on it."""
    bits = "".join(f"{byte:08b}" for byte in data)
    bits += "0" * (-len(bits) % 5)
    words = [int(bits[i:i + 5], 2) for i in range(0, len(bits), 5)]
    expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    polymod = _bech32_polymod(expanded + words + [0] * 6) ^ 1
    checksum = [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(_BECH32[w] for w in words + checksum)


def age_keys(key_b64: str) -> tuple[str, str]:
    """(identity, recipient) of the age X25519 key whose scalar is these 32 bytes (base64)."""
    scalar = base64.b64decode(key_b64, validate=True)
    if len(scalar) != AGE_KEY_BYTES:
        raise ValueError(f"an age X25519 key is {AGE_KEY_BYTES} bytes, not {len(scalar)}")
    public = X25519PrivateKey.from_private_bytes(scalar).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return bech32("age-secret-key-", scalar).upper(), bech32("age", public)


def snapshot_azure_config(blob_endpoint: str, container: str, client_id: str, age_recipient: str) -> str:
    """The text of defaults.ETCD_SNAPSHOT_AZURE_CONFIG, as kilonode/node/etcd_snapshot.py reads it."""
    return json.dumps({"blobEndpoint": blob_endpoint, "container": container, "clientId": client_id,
                       "ageRecipient": age_recipient}, indent=2) + "\n"


def backup_account_name(cluster: str, subscription: str) -> str:
    """Unique across Azure and stable (kilonode.plan.azure_names.storage_account_name): the
    same name this account has always had, so existing accounts stay where they are."""
    return storage_account_name(cluster, STORAGE_TAG, subscription)


def blob_endpoint(account_name: str) -> str:
    """Azure public cloud's blob endpoint of an account (as kilonode.azure.node_image assumes)."""
    return f"https://{account_name}.blob.core.windows.net/"


@dataclass(frozen=True)
class EtcdBackupArgs:
    cluster: str
    location: str
    zones: Sequence[str]  # the plan's zones: none -> a locally redundant account
    resource_group_name: pulumi.Input[str]
    resource_group_id: pulumi.Output[str]  # the subscription comes from it
    etcd_subnet_id: pulumi.Input[str]  # the members' subnet: the one network that writes snapshots
    deployer_ip_rules: Sequence[str] = ()  # storage_ip_rules(deployer.cidrs): the restore reads from there


def _retention_policy() -> storage.ManagementPolicySchemaArgs:
    """The account's lifecycle rule: a snapshot blob is deleted once older than the retention."""
    return storage.ManagementPolicySchemaArgs(rules=[storage.ManagementPolicyRuleArgs(
        name="delete-old-etcd-snapshots",
        type=storage.RuleType.LIFECYCLE,
        enabled=True,
        definition=storage.ManagementPolicyDefinitionArgs(
            # a prefix starts with the container's name
            filters=storage.ManagementPolicyFilterArgs(
                blob_types=["blockBlob"], prefix_match=[f"{defaults.ETCD_SNAPSHOT_CONTAINER}/"],
            ),
            actions=storage.ManagementPolicyActionArgs(base_blob=storage.ManagementPolicyBaseBlobArgs(
                delete=storage.DateAfterModificationArgs(
                    days_after_modification_greater_than=defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS,
                ),
            )),
        ),
    )])


class EtcdBackup(pulumi.ComponentResource):
    account_name: pulumi.Output[str]
    container_name: pulumi.Output[str]
    blob_endpoint: pulumi.Output[str]
    identity_id: pulumi.Output[str]  # attach to every etcd VM (user-assigned)
    client_id: pulumi.Output[str]  # the token request names it (IMDS client_id)
    snapshot_recipient: pulumi.Output[str]  # age recipient the members encrypt to (public)
    snapshot_identity: pulumi.Output[str]  # secret: the age identity that decrypts them

    def __init__(self, name: str, args: EtcdBackupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:EtcdBackup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        rg, resource_tags = args.resource_group_name, tags(args.cluster, ROLE)
        account_name = args.resource_group_id.apply(
            lambda rg_id: backup_account_name(args.cluster, subscription_of(rg_id))
        )
        account = storage.StorageAccount(
            f"{name}-account",
            account_name=account_name,
            resource_group_name=rg,
            location=args.location,
            kind=storage.Kind.STORAGE_V2,
            sku=storage.SkuArgs(name=storage.SkuName.STANDARD_ZRS if args.zones else storage.SkuName.STANDARD_LRS),
            access_tier=storage.AccessTier.HOT,
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            default_to_o_auth_authentication=True,
            enable_https_traffic_only=True,
            minimum_tls_version=storage.MinimumTlsVersion.TLS1_2,
            network_rule_set=storage_network_rules(args.deployer_ip_rules, [args.etcd_subnet_id]),
            tags=resource_tags,
            # Losing this account loses every snapshot: a `pulumi destroy` must not take it along
            # without someone lifting the flag first.
            opts=pulumi.ResourceOptions(parent=self, protect=True),
        )
        container = storage.BlobContainer(
            f"{name}-container",
            container_name=defaults.ETCD_SNAPSHOT_CONTAINER,
            account_name=account.name,
            resource_group_name=rg,
            public_access=storage.PublicAccess.NONE,
            opts=child,
        )
        storage.ManagementPolicy(
            f"{name}-lifecycle",
            management_policy_name=MANAGEMENT_POLICY_NAME,
            account_name=account.name,
            resource_group_name=rg,
            policy=_retention_policy(),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[container]),
        )
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity",
            resource_name_=f"{args.cluster}-{ROLE}",
            resource_group_name=rg,
            location=args.location,
            tags=resource_tags,
            opts=child,
        )
        definition = args.resource_group_id.apply(
            lambda rg_id: role_definition_id(rg_id, STORAGE_BLOB_DATA_CONTRIBUTOR)
        )
        # the container only: not the account, not the resource group
        assign_role(f"{name}-blob-writer", scope=container.id, principal_id=identity.principal_id,
                    definition=definition, description=f"kilonode {args.cluster}: etcd members write their snapshots",
                    opts=child)
        self.account_name = account.name
        self.container_name = container.name
        self.blob_endpoint = account.name.apply(blob_endpoint)
        self.identity_id = identity.id
        self.client_id = identity.client_id
        self._snapshot_key(name)
        self.register_outputs({
            "accountName": self.account_name, "container": self.container_name,
            "blobEndpoint": self.blob_endpoint, "identityId": self.identity_id, "clientId": self.client_id,
        })

    def _snapshot_key(self, name: str) -> None:
        """The age key the snapshots are encrypted to. Replacing it leaves the snapshots already
        uploaded readable only with the old identity (kept in the stack's history until the
        retention deletes them)."""
        key = random.RandomBytes(f"{name}-snapshot-key", length=AGE_KEY_BYTES,
                                 opts=pulumi.ResourceOptions(parent=self))
        keys = key.base64.apply(age_keys)
        self.snapshot_identity = pulumi.Output.secret(keys.apply(lambda pair: pair[0]))
        # the recipient is a public key: unsecret, so the members' config and a plan show it
        self.snapshot_recipient = pulumi.Output.unsecret(keys.apply(lambda pair: pair[1]))

    def host_file(self) -> DeliveredFile:
        """The Azure half of the snapshot job's config (defaults.ETCD_SNAPSHOT_AZURE_CONFIG), for
        every etcd member's custom data: only formatting happens in the apply."""
        content = pulumi.Output.all(self.blob_endpoint, self.container_name, self.client_id,
                                    self.snapshot_recipient).apply(lambda values: snapshot_azure_config(*values))
        return DeliveredFile(defaults.ETCD_SNAPSHOT_AZURE_CONFIG, content)
