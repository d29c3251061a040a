"""storage-access: the cluster's storage accounts take Entra ID only, from named networks only.

Two accounts hold what a cluster must not leak: the etcd snapshots (kilonode.azure.backup) and
the node images' VHDs (kilonode.azure.node_image). Read from the recorded graph, each must:
refuse shared keys (`allowSharedKeyAccess: false`: no account key exists that could leak),
refuse anonymous reads (`allowBlobPublicAccess: false`), take HTTPS with TLS 1.2 or later
only, and deny every network it does not name (`networkRuleSet.defaultAction: Deny`).

It warns where the deployer cannot reach the image account: its upload comes from the
addresses in `deployer.cidrs`, and Azure's IP rules take public addresses only and never
match traffic from the account's own region (Azure Storage network security, IP network
rules): a `peered` runner, or an `internet` one with no public address listed, is refused.
"""

from __future__ import annotations

from kilonode.azure.common import storage_ip_rules
from kilonode.preflight.model import Finding, Inputs

NAME = "storage-access"
TITLE = "storage accounts take Entra ID only, over TLS 1.2, from named networks only"

ACCOUNT = "azure-native:storage:StorageAccount"


def check(inputs: Inputs) -> list[Finding]:
    findings: list[Finding] = []
    for account in inputs.of_type(ACCOUNT):
        i = account.inputs
        rules = i.get("networkRuleSet") or {}
        problems = [
            *(["allows shared keys (allowSharedKeyAccess is not false): an account key could read and write "
               "everything in it"] if i.get("allowSharedKeyAccess") is not False else []),
            *(["accepts every network (networkRuleSet.defaultAction is not Deny)"]
              if rules.get("defaultAction") != "Deny" else []),
            *(["allows anonymous blob access"] if i.get("allowBlobPublicAccess") is not False else []),
            *(["accepts TLS older than 1.2"] if i.get("minimumTlsVersion") != "TLS1_2" else []),
            *(["accepts plain HTTP"] if i.get("enableHttpsTrafficOnly") is not True else []),
        ]
        for problem in problems:
            findings.append(Finding(
                NAME, "break", account.describe(), f"the account {problem}",
                "allowSharedKeyAccess: false, allowBlobPublicAccess: false, minimumTlsVersion: TLS1_2, "
                "enableHttpsTrafficOnly: true and networkRuleSet.defaultAction: Deny, admitting only what must "
                "reach it (kilonode.azure.common.storage_network_rules)",
            ))
    deployer = inputs.plan.network.deployer
    if deployer is not None and inputs.of_type(ACCOUNT):
        public = storage_ip_rules(deployer.cidrs)
        if deployer.network == "peered" or not public:
            findings.append(Finding(
                NAME, "warn", "deployer",
                f"the node images' upload and the snapshot restore come from the deployer, but the storage accounts "
                f"admit it by public IP only ({', '.join(public) or 'none of deployer.cidrs is public'}); a peered "
                "runner in the region reaches Storage from private addresses no IP rule matches: `pulumi up` stops "
                "at the VHD upload (403 AuthorizationFailure)",
                "run `pulumi up` from a machine whose public egress address is in deployer.cidrs, or give the "
                "runner's subnet a Microsoft.Storage service endpoint and add it to the image account "
                "(`az storage account network-rule add --subnet <its subnet ID>`); docs/azure.md",
            ))
    return findings
