"""EtcdBackup: where the etcd members' scheduled snapshots go in Azure, and who may write there.

A storage account of the cluster's own and, for each etcd cluster (main, events, leases where the
stack has it), a container of its own (`etcd-snapshots-<role>`, snapshot_container) and a
user-assigned identity of its own that only that cluster's VMs carry (kilonode.azure.cluster),
allowed to write blobs in that container and nowhere else. An events member's token cannot touch
the main cluster's snapshots: a role assignment scoped to a container reaches that container's
blobs only, and a member carries no other identity. preflight's `etcd-backups` check proves it
on the recorded graph.

What a member may do there is a custom role of one data action, `blobs/write`
(SNAPSHOT_WRITER_DATA_ACTIONS, which the snapshot script's Put Blob, Put Block and Put Block
List need): no read, no delete, no control-plane action (not the container's deletion, not its
immutability policy). "Storage Blob Data Contributor", the narrowest built-in role that writes,
also deletes blobs and deletes the container itself. `blobs/write` still replaces a blob;
what stops that is each container's time-based retention policy (immutability, container-level
WORM) of defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS: while a blob is younger than that, nobody
overwrites or deletes it, the members included, and no member holds the control-plane right to
shorten or remove the policy. After it, the lifecycle rule deletes the blob; blob and container
soft delete (defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS) keep what is deleted recoverable a while.
The policy is left unlocked: locked, not even the subscription's owners could shorten it, delete
it, or delete the account while a container holds blobs, and locking cannot be undone (nor done
by Pulumi: it is an action, not a resource); docs/azure.md says how to lock it by hand.

The snapshot script on each member asks the instance metadata service for a token of its
cluster's identity and writes with the Blob REST API; it needs the account's blob endpoint, its
cluster's container and the identity's client ID, which Azure knows only once it created them:
`host_file(role)` is that file, for the program to deliver beside the TLS files (custom data).

Snapshots leave the member encrypted with `age` (kilonode.node.etcd_snapshot): the members hold
only the recipient (a public X25519 key), so no VM can read back what was uploaded; the
identity that decrypts is random bytes Pulumi keeps as a secret, exported as the stack output
`etcdSnapshotIdentity` for the restore (docs/runbooks/etcd-restore-from-snapshot.md). age
gives confidentiality, not authenticity (anyone with the public recipient can encrypt): each
upload comes with a manifest of the snapshot's and the ciphertext's SHA-256, signed with the
member's etcd server key, which the restore checks against the cluster's own etcd CA
(`etcd<Role>CaCert`) before it decrypts anything.

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
from pulumi_azure_native import authorization, managedidentity, storage

from kilonode.azure.common import storage_network_rules, tags
from kilonode.azure.custom_data import DeliveredFile
from kilonode.azure.identity import assign_role, role_definition_id, subscription_of
from kilonode.plan import defaults
from kilonode.plan.azure_names import role_definition_name, storage_account_name

# What the snapshot job's identity may do, and nothing more: the Blob service operations it calls
# (kilonode.node.etcd_snapshot: Put Blob for a snapshot of one block and for its manifest, Put
# Block and Put Block List beyond that) need `blobs/write` ("Permissions for Blob service
# operations", learn.microsoft.com/rest/api/storageservices/authorize-with-azure-active-directory:
# Put Blob "For create or replace: .../blobs/write", Put Block and Put Block List
# ".../blobs/write"). `blobs/add/action` alone (create, never replace) would be narrower, but
# takes Put Blob only, and a snapshot at etcd's 8 GiB quota ceiling goes up in blocks.
SNAPSHOT_WRITER_DATA_ACTIONS: tuple[str, ...] = (
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
)
# A storage account's lifecycle management policy is always named "default" (the SDK's
# ManagementPolicyArgs.management_policy_name: "It should always be 'default'"); so are its blob
# service's properties (BlobServicePropertiesArgs.blob_services_name) and a container's
# immutability policy (BlobContainerImmutabilityPolicyArgs.immutability_policy_name:
# "ImmutabilityPolicy Name must be 'default'").
DEFAULT = "default"
ROLE = "etcd-backup"
STORAGE_TAG = "etcdbk"  # kilonode.plan.azure_names.STORAGE_TAGS


def snapshot_container(role: str) -> str:
    """The container of one etcd cluster's snapshots (main -> etcd-snapshots-main)."""
    return f"{defaults.ETCD_SNAPSHOT_CONTAINER_PREFIX}-{role}"


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
    roles: Sequence[str] = ("main", "events")  # the plan's etcd clusters: a container and an identity each


def _retention_policy(containers: Sequence[str]) -> storage.ManagementPolicySchemaArgs:
    """The account's lifecycle rule: a snapshot blob is deleted once older than the retention."""
    return storage.ManagementPolicySchemaArgs(rules=[storage.ManagementPolicyRuleArgs(
        name="delete-old-etcd-snapshots",
        type=storage.RuleType.LIFECYCLE,
        enabled=True,
        definition=storage.ManagementPolicyDefinitionArgs(
            # a prefix starts with the container's name
            filters=storage.ManagementPolicyFilterArgs(
                blob_types=["blockBlob"], prefix_match=[f"{container}/" for container in containers],
            ),
            actions=storage.ManagementPolicyActionArgs(base_blob=storage.ManagementPolicyBaseBlobArgs(
                delete=storage.DateAfterModificationArgs(
                    days_after_modification_greater_than=defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS,
                ),
            )),
        ),
    )])


def _soft_delete() -> storage.DeleteRetentionPolicyArgs:
    """Deleted blobs (or containers) recoverable for defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS."""
    return storage.DeleteRetentionPolicyArgs(enabled=True, days=defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS)


class EtcdBackup(pulumi.ComponentResource):
    account_name: pulumi.Output[str]
    blob_endpoint: pulumi.Output[str]
    # etcd cluster role (main, events, leases) -> its container, and the identity its VMs carry
    # (user-assigned) and the token request names (IMDS client_id)
    container_names: dict[str, pulumi.Output[str]]
    identity_ids: dict[str, pulumi.Output[str]]
    client_ids: dict[str, pulumi.Output[str]]
    snapshot_recipient: pulumi.Output[str]  # age recipient the members encrypt to (public)
    snapshot_identity: pulumi.Output[str]  # secret: the age identity that decrypts them

    def __init__(self, name: str, args: EtcdBackupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:EtcdBackup", name, None, opts)
        self._name, self._args = name, args
        child = pulumi.ResourceOptions(parent=self)
        rg = args.resource_group_name
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
            tags=tags(args.cluster, ROLE),
            # Losing this account loses every snapshot: a `pulumi destroy` must not take it along
            # without someone lifting the flag first.
            opts=pulumi.ResourceOptions(parent=self, protect=True),
        )
        self.account_name = account.name
        # a deleted blob or container stays recoverable (defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS)
        storage.BlobServiceProperties(
            f"{name}-blob-service", blob_services_name=DEFAULT, account_name=account.name, resource_group_name=rg,
            delete_retention_policy=_soft_delete(), container_delete_retention_policy=_soft_delete(), opts=child,
        )
        writer = self._writer_role()
        self.container_names, self.identity_ids, self.client_ids = {}, {}, {}
        containers = [self._cluster(role, writer) for role in args.roles]
        storage.ManagementPolicy(
            f"{name}-lifecycle",
            management_policy_name=DEFAULT,
            account_name=account.name,
            resource_group_name=rg,
            policy=_retention_policy([snapshot_container(role) for role in args.roles]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=containers),
        )
        self.blob_endpoint = account.name.apply(blob_endpoint)
        self._snapshot_key(name)
        self.register_outputs({
            "accountName": self.account_name, "blobEndpoint": self.blob_endpoint,
            "containers": self.container_names, "identityIds": self.identity_ids, "clientIds": self.client_ids,
        })

    def _writer_role(self) -> pulumi.Output[str]:
        """The custom role of SNAPSHOT_WRITER_DATA_ACTIONS, assignable in the cluster's resource
        group only; its role definition ID, for the assignments that wait for it."""
        args, group = self._args, self._args.resource_group_id
        guid = group.apply(lambda g: role_definition_name(g, ROLE))
        definition = authorization.RoleDefinition(
            f"{self._name}-writer-role",
            role_definition_id=guid,
            # a role's name is unique in the tenant: the group's subscription and name say whose
            role_name=group.apply(lambda g: f"kilonode {args.cluster} etcd snapshot writer "
                                            f"({subscription_of(g)}/{g.rpartition('/')[2]})"),
            description=f"kilonode {args.cluster}: etcd members write their snapshots, and nothing else "
                        "(kilonode.azure.backup)",
            role_type="CustomRole",
            scope=group,
            assignable_scopes=[group],
            permissions=[authorization.PermissionArgs(actions=[], data_actions=list(SNAPSHOT_WRITER_DATA_ACTIONS))],
            opts=pulumi.ResourceOptions(parent=self),
        )
        return pulumi.Output.all(group, guid, definition.id).apply(lambda v: role_definition_id(v[0], v[1]))

    def _cluster(self, role: str, writer: pulumi.Output[str]) -> storage.BlobContainer:
        """One etcd cluster's container, its retention policy, and the identity that alone may
        write there (kept in self.container_names, identity_ids, client_ids under `role`)."""
        name, args, child = f"{self._name}-{role}", self._args, pulumi.ResourceOptions(parent=self)
        container = storage.BlobContainer(
            f"{name}-container", container_name=snapshot_container(role), account_name=self.account_name,
            resource_group_name=args.resource_group_name, public_access=storage.PublicAccess.NONE, opts=child,
        )
        # Nobody overwrites or deletes a snapshot younger than the retention (the docstring says why unlocked)
        storage.BlobContainerImmutabilityPolicy(
            f"{name}-retention", immutability_policy_name=DEFAULT, account_name=self.account_name,
            container_name=container.name, resource_group_name=args.resource_group_name,
            immutability_period_since_creation_in_days=defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS,
            allow_protected_append_writes=False, opts=child,
        )
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity", resource_name_=f"{args.cluster}-{ROLE}-{role}",
            resource_group_name=args.resource_group_name, location=args.location,
            tags=tags(args.cluster, f"{ROLE}-{role}"), opts=child,
        )
        # this container only: not the account, not the resource group, not another cluster's container
        assign_role(f"{name}-writer", scope=container.id, principal_id=identity.principal_id, definition=writer,
                    description=f"kilonode {args.cluster}: the etcd {role} members write their snapshots", opts=child)
        self.container_names[role] = container.name
        self.identity_ids[role] = identity.id
        self.client_ids[role] = identity.client_id
        return container

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

    def host_file(self, role: str) -> DeliveredFile:
        """The Azure half of the snapshot job's config (defaults.ETCD_SNAPSHOT_AZURE_CONFIG) for
        every member of etcd cluster `role`: its own container and identity. Only formatting
        happens in the apply."""
        content = pulumi.Output.all(self.blob_endpoint, self.container_names[role], self.client_ids[role],
                                    self.snapshot_recipient).apply(lambda values: snapshot_azure_config(*values))
        return DeliveredFile(defaults.ETCD_SNAPSHOT_AZURE_CONFIG, content)
