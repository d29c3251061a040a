"""Scheduled etcd snapshots."""

# Scheduled etcd snapshots (kilonode.render.etcd_snapshot on every member of both clusters;
# kilonode.azure.backup for the storage account). etcd tolerates the loss of a minority; past
# that only a snapshot brings the data back, and "all that is needed is a single snapshot" of
# the cluster (etcd-io/website content/en/docs/v3.5/op-guide/recovery.md, which asks to "save
# snapshots periodically" without naming an interval). Every 15 minutes: the interval kOps'
# etcd-manager backs its clusters up at by default (kubernetes-sigs/etcd-manager
# cmd/etcd-manager/main.go InitDefaults, BackupInterval "15m", read at 08036abf), so a restore
# loses at most a quarter of an hour of writes; controllers rebuild most derived state (pods,
# endpoints, leases) after it, what is lost for good is what users wrote in that window. The
# cost is one DB-sized read on the leader plus the copy. Measured here (etcd 3.4, 2 cores at
# load 3.9): a 295 MB DB saved in 3.0 s, ~100 MB/s; at that rate a DB at the 8 GiB quota
# ceiling takes ~85 s to save, and its upload (not measured: no Azure here) as long again at
# 100 MB/s to storage: minutes, inside the interval. The timer fires on every member at the
# same wall-clock minutes (so it must divide 60), and only the member leading the cluster at
# that moment takes the snapshot: one per cluster per interval, not one per member.
ETCD_SNAPSHOT_INTERVAL_MIN = 15
# A run that has not finished in 10 minutes is stopped (and the unit fails, visibly) before the
# next one is due; the next run starts afresh.
ETCD_SNAPSHOT_TIMEOUT_S = 600
# Newest snapshots kept on the member's local SSD beside the data dir (an hour's worth): the
# quickest restore when the VMs survived; Azure's copy is the one that survives a deallocation,
# which wipes the local SSD. 4 x 8 GiB at the quota ceiling fits the smallest etcd size's
# temp disk (Standard_D4ds_v5: 150 GiB) with the data dir.
ETCD_SNAPSHOT_KEEP_LOCAL = 4
# The Azure copies: deleted by the storage account's lifecycle policy after 7 days. A week is
# the horizon etcd's restore guidance sizes its revision bump for ("cover a week old snapshot
# with bumping by 1'000'000'000 assuming that etcd runs with less than 1500 writes per
# second", op-guide/recovery.md v3.5) and how long etcd-manager keeps its hourly backups
# (pkg/backupcontroller/cleanup.go HourlyBackupsRetention). At one snapshot per 15 minutes a
# week is 672 blobs per cluster: ~670 GiB for a 1 GiB DB, ~5.3 TiB at the 8 GiB ceiling.
# The same number of days is each snapshot container's time-based retention (immutability)
# policy: until a blob is that old nobody can overwrite or delete it, the members included
# (kilonode.azure.backup), and then the lifecycle rule deletes it, which the policy allows once
# it has expired ("After the retention period has expired, objects can be deleted but not
# overwritten", MicrosoftDocs/azure-docs articles/storage/blobs/immutable-storage-overview.md).
ETCD_SNAPSHOT_BLOB_RETENTION_DAYS = 7
# One container per etcd cluster, `etcd-snapshots-<role>` (main, events, leases where the stack
# has it), each written by an identity of its own that only that cluster's members carry
# (kilonode.azure.backup): a role assignment's narrowest scope for blob data is a container, so a
# member of one cluster can neither write nor read nor touch another cluster's snapshots.
ETCD_SNAPSHOT_CONTAINER_PREFIX = "etcd-snapshots"
# Deleted blobs and containers of the snapshot account stay recoverable this long (blob soft
# delete and container soft delete): 7 days is the minimum Microsoft recommends for both
# ("Data protection overview", MicrosoftDocs/azure-docs articles/storage/blobs/
# data-protection-overview.md, the "Restore" table: "Recommended for all storage accounts, with a
# minimum retention period of 7 days"). What it covers beside the containers' retention policy
# (under which nothing is deleted before ETCD_SNAPSHOT_BLOB_RETENTION_DAYS): a delete after that
# by someone with a data-plane delete right, a container deleted by an administrator once its
# policy is gone. What it costs: the lifecycle rule's deletes are soft deletes too ("Lifecycle
# delete actions produce soft-deleted objects", articles/storage/blobs/
# soft-delete-blob-overview.md), billed as active data, so each snapshot is kept and billed for
# another week after its retention: twice the week's figures above.
ETCD_SNAPSHOT_SOFT_DELETE_DAYS = 7
# Blob upload block size: Put Block takes at most 4,000 MiB per block from x-ms-version
# 2019-12-12 and a blob at most 50,000 blocks (learn.microsoft.com rest/api/storageservices
# put-block; the Blob storage scale targets); 64 MiB blocks keep the uploader's memory small and
# reach 3 TiB, and an 8 GiB snapshot is 128 of them.
ETCD_SNAPSHOT_BLOCK_BYTES = 64 * 1024 * 1024
# Where the Pulumi program delivers the Azure half of the snapshot job's config (account's blob
# endpoint, container, the identity's client ID: known only once Azure created them), beside the
# rendered /etc/kilonode/etcd-snapshot.json that names this path. No file: no upload (a local
# rehearsal). A host path both layers must agree on: it belongs with kilonode.plan.wellknown.
ETCD_SNAPSHOT_AZURE_CONFIG = "/etc/kilonode/etcd-snapshot-azure.json"
