"""EtcdBackup: where the etcd members' scheduled snapshots go in Azure, and who may write there.

A storage account of the cluster's own, a container for both etcd clusters' snapshots (each
under its prefix, main/ and events/: kilonode.render.etcd_snapshot), a lifecycle rule that
deletes them after defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS, and a user-assigned identity
for the etcd VMs with "Storage Blob Data Contributor" on that one container, nothing wider.
The snapshot script on each member asks the instance metadata service for a token of this
identity and writes with the Blob REST API; it needs the account's blob endpoint, the container
and the identity's client ID, which Azure knows only once it created them: `host_file()` is
that file, for the program to deliver beside the TLS files (custom data).

The account takes no anonymous access, no shared keys (only Microsoft Entra tokens, so no
account key exists that could leak), HTTPS with TLS 1.2 or later only; zone-redundant where
the region has availability zones, so the copies outlive the zone that may have taken the
etcd members with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import managedidentity, storage

from kilonode.azure.common import tags
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
        self.register_outputs({
            "accountName": self.account_name, "container": self.container_name,
            "blobEndpoint": self.blob_endpoint, "identityId": self.identity_id, "clientId": self.client_id,
        })

    def host_file(self) -> DeliveredFile:
        """The Azure half of the snapshot job's config (defaults.ETCD_SNAPSHOT_AZURE_CONFIG), for
        every etcd member's custom data: only formatting happens in the apply."""
        content = pulumi.Output.all(self.blob_endpoint, self.container_name, self.client_id).apply(
            lambda values: json.dumps(
                {"blobEndpoint": values[0], "container": values[1], "clientId": values[2]}, indent=2
            ) + "\n"
        )
        return DeliveredFile(defaults.ETCD_SNAPSHOT_AZURE_CONFIG, content)
