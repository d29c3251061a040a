"""NodeImage: the node-image build's VHDs published through an Azure Compute Gallery.

Per pool, and per control-plane role (etcd, control-plane): the VHD uploaded as a page blob
-> a Gen2 image definition -> an image version replicated `plan.gallery_replicas` times for
a pool (Azure Compute Gallery doc: 1 replica per 20 VMs created at once, >= 3 for
production, <= 100 per version), `plan.role_image_replicas` for a role. The VHD files are
the node-image build's output; this component only uploads and publishes them.

Why a command for the upload: Azure builds disk images from page blobs only, and
pulumi-azure-native's `storage.Blob` creates block and append blobs only (its BlobType enum
offers Block and Append: provider/pkg/resources/customresources/custom_storage_azidentity.go;
pulumi/pulumi-azure-native#2151). That resource would authenticate well enough (its data-plane
client is `azblob.NewClient` with the provider's Entra ID token credential, no account key),
but it cannot write a page blob. `az storage blob upload --type page --auth-mode login` runs as
a pulumi-command resource, so it is still in the graph (and in `kilonode plan`), ordered after
the container and the deployer's role assignment, before the image version. It needs the `az`
CLI, logged in as the identity `pulumi up` runs as.

No shared keys: the account refuses them (`allowSharedKeyAccess: false`), so no account key
exists to leak or to list. The upload runs as whoever runs `pulumi up`: the program gives that
principal (`authorization.get_client_config()`, its object ID) "Storage Blob Data Contributor"
on this account, as a resource of its own. Azure may take minutes to apply a new role
assignment ("Troubleshoot Azure RBAC": up to 10 minutes), so the upload retries for as long.

Network: the account denies every source (`networkRuleSet.defaultAction: Deny`) but the
deployer's public addresses (`deployer.cidrs`, kilonode.azure.common.storage_ip_rules), which
the upload comes from, and `bypass: AzureServices`, the only exception Azure Storage offers
for the platform's own readers. Compute (the gallery, which copies the VHD into an image
version) is not on Microsoft's published list of trusted services
(storage-network-security-trusted-azure-services.md), and no Microsoft page says whether a
gallery reads a VHD from an account behind a firewall: docs/azure.md says how to confirm it on
a first deployment, and what to do if it fails. A `peered` deployer's runner reaches the
account from private addresses that no IP rule matches (Azure's own rule: same-region traffic
is never matched by IP rules): preflight's `storage-access` says so, and docs/azure.md how to
admit its subnet.

Each version has its own upload, which runs once, when the version is new, and never again:
its blob is the disk its gallery version was copied from (a gallery image version is a copy
Azure makes once, at creation), and a kept previous version's is the rollback target. A VHD
rebuilt under a published version is therefore not uploaded: scale sets boot a rebuilt disk
only under a new version (nodeImage.version, or the pool's), which the review asks for when
the image's recipe changed (image-recipe-unreleased).

The storage account's name is global in Azure (kilonode.plan.azure_names.storage_account_name):
the cluster's name, "img", and a digest of the subscription and the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
from pulumi_azure_native import authorization, compute, storage
from pulumi_command import local

from kilonode.azure.common import storage_network_rules, tags
from kilonode.azure.identity import (
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    assignment_name,
    role_definition_id,
    subscription_of,
)
from kilonode.digest import sha256_file
from kilonode.plan.azure_names import storage_account_name
from kilonode.plan.model import ClusterPlan

# Where `kilonode image build STACK --pool POOL --out build/node-image` writes a pool's disk
# (kilonode.image.build names it <stack>-<pool>.vhd; --role etcd gives <stack>-etcd.vhd);
# ClusterArgs may point elsewhere.
DEFAULT_VHD_DIR = "build/node-image"


def default_vhd(stack: str, pool: str) -> str:
    return f"{DEFAULT_VHD_DIR}/{stack}-{pool}.vhd"


STORAGE_TAG = "img"  # kilonode.plan.azure_names.STORAGE_TAGS
# What the upload is keyed by when the program does not read the VHDs (under the mock engine,
# so that a plan is the same on every machine) or a VHD is not built yet.
NOT_READ = "not-read"
ABSENT = "absent"


def vhd_digest(path: str, read: bool = True) -> str:
    """The VHD's sha256 (the upload's key), or why there is none. Read in pieces: VHDs are
    gigabytes (seconds per image at each `pulumi up`)."""
    if not read:
        return NOT_READ
    vhd = Path(path)
    return f"sha256:{sha256_file(vhd)}" if vhd.is_file() else ABSENT


# A new role assignment can take up to 10 minutes to apply ("Troubleshoot Azure RBAC"): the upload
# tries UPLOAD_ATTEMPTS times, UPLOAD_RETRY_S apart, before it fails the run.
UPLOAD_ATTEMPTS = 21
UPLOAD_RETRY_S = 30
UPLOAD_COMMAND = (
    f'for attempt in $(seq {UPLOAD_ATTEMPTS}); do '
    'az storage blob upload --auth-mode login --type page --overwrite --no-progress '
    '--account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BLOB" --file "$VHD" && exit 0; '
    f'echo "upload of $BLOB refused (attempt $attempt): a new role assignment can take minutes" >&2; '
    f'sleep {UPLOAD_RETRY_S}; done; exit 1'
)


def _no_principal_type(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
    """Drop the principalType the SDK fills in as "User" when none is given (its RoleAssignment
    constructor: `if principal_type is None: principal_type = 'User'`): Azure then reads the
    principal's type from Entra ID itself."""
    props = {key: value for key, value in args.props.items() if key != "principal_type"}
    return pulumi.ResourceTransformationResult(props, args.opts)


def gallery_name(component: str) -> str:
    """Gallery names allow letters, digits, '_' and '.', not '-'."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", component)


def image_gallery(cluster: str) -> str:
    """The Azure name of the cluster's gallery (the Cluster component names its NodeImage
    `<cluster>-image`, kilonode.azure.cluster; the gallery is `<that>-gallery`), in the cluster's
    own resource group."""
    return gallery_name(f"{cluster}-image-gallery")


@dataclass(frozen=True)
class GalleryImageSpec:
    """One image definition and the version of it the cluster's machines boot."""

    name: str  # a pool's name, or a role's (etcd, control-plane): the image definition's name
    version: str  # its gallery version (stack: nodeImage.version, etcdImage.version, ...)
    replicas: int
    previous: str | None = None  # the version before, kept published (nodeImage.previous, ...)


def gallery_images(plan: ClusterPlan) -> list[GalleryImageSpec]:
    """Every image the plan's machines boot (ClusterPlan.boot_images)."""
    return [GalleryImageSpec(image.name, image.version, image.replicas, image.previous) for image in plan.boot_images]


def absent_vhds(vhds: Mapping[str, str]) -> list[str]:
    """The VHDs (image name -> path) that are not built: `pulumi up` must not start without them
    (an upload of an absent file fails only after UPLOAD_ATTEMPTS retries, and every scale set
    waits on the image component)."""
    return [path for path in vhds.values() if not Path(path).is_file()]


@dataclass(frozen=True)
class NodeImageArgs:
    cluster: str
    location: str
    resource_group_name: pulumi.Input[str]
    resource_group_id: pulumi.Output[str]  # the subscription comes from it (the account's name)
    images: Sequence[GalleryImageSpec]  # gallery_images(plan)
    vhds: Mapping[str, str]  # image name -> VHD path from the node-image build
    vhd_digests: Mapping[str, str]  # image name -> vhd_digest(its VHD)
    deployer_ip_rules: Sequence[str] = ()  # storage_ip_rules(deployer.cidrs): where the upload comes from


@dataclass(frozen=True)
class _Storage:
    """Where every image goes: the VHDs' storage account and container, and the gallery."""

    account: storage.StorageAccount
    container: storage.BlobContainer
    gallery: compute.Gallery
    uploader: authorization.RoleAssignment  # the deployer's right to write the VHDs


def _blob_name(spec: GalleryImageSpec, version: str | None = None) -> str:
    return f"{spec.name}-{version or spec.version}.vhd"


def upload_name(component: str, spec: GalleryImageSpec, version: str) -> str:
    """One upload per version (a kept version's stays while the next one's is created)."""
    return f"{component}-{spec.name}-{version}-vhd"


def _former_upload_name(component: str, spec: GalleryImageSpec) -> str:
    """What the upload was named when one image had one upload, whatever its version: the oldest
    version published adopts that state (an alias), so a stack deployed before uploads were named
    by version neither deletes its blob nor uploads it again."""
    return f"{component}-{spec.name}-vhd"


class NodeImage(pulumi.ComponentResource):
    image_version_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: NodeImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:NodeImage", name, None, opts)
        store = self._storage(name, args)
        self.image_version_ids = {}
        for spec in args.images:
            definition = self._image_definition(name, args, store, spec)
            for version in (spec.version, *([spec.previous] if spec.previous else [])):
                kept = version != spec.version
                oldest = version == (spec.previous or spec.version)
                upload = self._upload_vhd(name, store, spec, version, args.vhds[spec.name],
                                          args.vhd_digests[spec.name], oldest)
                published = self._image_version(name, args, store, spec, version, definition, upload)
                if not kept:
                    self.image_version_ids[spec.name] = published.id
        self.register_outputs({"imageVersionIds": self.image_version_ids})

    def _storage(self, name: str, args: NodeImageArgs) -> _Storage:
        child = pulumi.ResourceOptions(parent=self)
        location, resource_tags = args.location, tags(args.cluster, "node-image")
        rg = args.resource_group_name

        account = storage.StorageAccount(
            f"{name}-vhds",
            account_name=args.resource_group_id.apply(
                lambda rg_id: storage_account_name(args.cluster, STORAGE_TAG, subscription_of(rg_id))
            ),
            resource_group_name=rg,
            kind="StorageV2",
            sku=storage.SkuArgs(name="Standard_LRS"),
            allow_blob_public_access=False,
            # Entra ID only (the module docstring): no account key exists that could leak.
            allow_shared_key_access=False,
            default_to_o_auth_authentication=True,
            enable_https_traffic_only=True,
            minimum_tls_version=storage.MinimumTlsVersion.TLS1_2,
            network_rule_set=storage_network_rules(args.deployer_ip_rules, azure_services=True),
            opts=child,
            location=location,
            tags=resource_tags,
        )
        container = storage.BlobContainer(
            f"{name}-vhds-container",
            container_name="vhds",
            account_name=account.name,
            resource_group_name=rg,
            public_access=storage.PublicAccess.NONE,
            opts=child,
        )
        gallery = compute.Gallery(
            f"{name}-gallery",
            gallery_name=gallery_name(f"{name}-gallery"),
            resource_group_name=rg,
            description=f"kilonode node images for {args.cluster}",
            opts=child,
            location=location,
            tags=resource_tags,
        )
        return _Storage(account, container, gallery, self._uploader(name, args, account))

    def _uploader(self, name: str, args: NodeImageArgs,
                  account: storage.StorageAccount) -> authorization.RoleAssignment:
        """The deployer's Storage Blob Data Contributor on this account: what the upload and its
        delete run as. Its principal is whoever runs `pulumi up` (a user or a service principal:
        the program cannot tell which, so it names no principalType and Azure looks it up; the
        SDK's default "User" would fail a CI service principal with UnmatchedPrincipalType)."""
        deployer = authorization.get_client_config_output().object_id
        definition = args.resource_group_id.apply(
            lambda rg_id: role_definition_id(rg_id, STORAGE_BLOB_DATA_CONTRIBUTOR)
        )
        return authorization.RoleAssignment(
            f"{name}-vhds-uploader",
            role_assignment_name=assignment_name(account.id, deployer, definition),
            scope=account.id,
            principal_id=deployer,
            role_definition_id=definition,
            description=f"kilonode {args.cluster}: `pulumi up` uploads the node images' VHDs",
            opts=pulumi.ResourceOptions(parent=self, transformations=[_no_principal_type]),
        )

    def _upload_vhd(self, name: str, store: _Storage, spec: GalleryImageSpec, version: str, vhd: str,
                    digest: str, oldest: bool) -> local.Command:
        """The page-blob upload of one version, as the deployer's Entra ID identity (the module
        docstring says why a command, and why it retries). It runs once, when its version is new:
        a published version's blob is the disk its gallery version was copied from, and a kept
        (previous) version's is the rollback target, so a VHD rebuilt later (the same version's, or
        the next version's build on disk) never replaces it (ignoreChanges on its key and path).
        Shipping a rebuilt image is a new version: the review's image-recipe-unreleased says so."""
        blob_name = _blob_name(spec, version)
        return local.Command(
            upload_name(name, spec, version),
            create=UPLOAD_COMMAND,
            delete=(
                'az storage blob delete --auth-mode login '
                '--account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BLOB"'
            ),
            environment={"ACCOUNT": store.account.name, "CONTAINER": store.container.name, "BLOB": blob_name,
                         "VHD": vhd},
            # What it uploaded (the VHD's digest when it ran; `absent` makes the program refuse
            # first) and where to: recorded, never acted on again (ignoreChanges below).
            triggers=[digest, blob_name],
            # Same content key, same blob name: the old blob goes first, else the replacement's
            # delete would remove the blob its create just uploaded.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[store.container, store.uploader], delete_before_replace=True,
                ignore_changes=["triggers", "environment"],
                aliases=[pulumi.Alias(name=_former_upload_name(name, spec))] if oldest else None),
        )

    def _image_definition(self, name: str, args: NodeImageArgs, store: _Storage,
                          spec: GalleryImageSpec) -> compute.GalleryImage:
        child = pulumi.ResourceOptions(parent=self)
        location, resource_tags = args.location, tags(args.cluster, "node-image")
        rg = args.resource_group_name
        return compute.GalleryImage(
            f"{name}-{spec.name}",
            gallery_image_name=spec.name,
            gallery_name=store.gallery.name,
            resource_group_name=rg,
            identifier=compute.GalleryImageIdentifierArgs(
                publisher="kilonode", offer=args.cluster, sku=spec.name
            ),
            os_type=compute.OperatingSystemTypes.LINUX,
            os_state=compute.OperatingSystemStateTypes.GENERALIZED,
            # GPU sizes (ND A100 v4, ND H100 v5) boot Gen2 images only.
            hyper_v_generation=compute.HyperVGeneration.V2,
            architecture="x64",
            features=[compute.GalleryImageFeatureArgs(name="IsAcceleratedNetworkSupported", value="True")],
            opts=child,
            location=location,
            tags=resource_tags,
        )

    def _image_version(self, name: str, args: NodeImageArgs, store: _Storage, spec: GalleryImageSpec, version: str,
                       definition: compute.GalleryImage, upload: local.Command) -> compute.GalleryImageVersion:
        location, resource_tags = args.location, tags(args.cluster, "node-image")
        rg = args.resource_group_name
        # Public-cloud blob endpoint of the blob the command uploaded.
        blob_url = pulumi.Output.concat(
            "https://", store.account.name, ".blob.core.windows.net/", store.container.name, "/",
            _blob_name(spec, version)
        )
        return compute.GalleryImageVersion(
            f"{name}-{spec.name}-{version}",
            gallery_image_version_name=version,
            gallery_image_name=definition.name,
            gallery_name=store.gallery.name,
            resource_group_name=rg,
            storage_profile=compute.GalleryImageVersionStorageProfileArgs(
                os_disk_image=compute.GalleryOSDiskImageArgs(
                    host_caching=compute.HostCaching.READ_ONLY,
                    source=compute.GalleryDiskImageSourceArgs(uri=blob_url, storage_account_id=store.account.id),
                )
            ),
            publishing_profile=compute.GalleryImageVersionPublishingProfileArgs(
                replica_count=spec.replicas,
                target_regions=[
                    compute.TargetRegionArgs(
                        name=args.location,
                        regional_replica_count=spec.replicas,
                        # Zone-redundant replicas: scale sets span the plan's zones.
                        storage_account_type="Standard_ZRS",
                    )
                ],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[upload]),
            location=location,
            tags=resource_tags,
        )
