"""Small pieces shared by the components: the admin login, the OS image reference, tags."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pulumi
from pulumi_azure_native import compute, storage

# The login Azure creates on every VM and scale-set instance; SSH reaches it only from
# network.adminCidr (see Network), and only with its role's keys (kilonode.azure.ssh).
ADMIN_USERNAME = "kilonode"


def gallery_image(image_version_id: pulumi.Input[str]) -> compute.ImageReferenceArgs:
    """A VM's image: a version in the cluster's Compute Gallery (kilonode.azure.node_image)."""
    return compute.ImageReferenceArgs(id=image_version_id)


def linux_config(ssh_public_keys: Sequence[pulumi.Input[str]]) -> compute.LinuxConfigurationArgs:
    """Key-only SSH for ADMIN_USERNAME, with its role's keys; passwords are never set."""
    return compute.LinuxConfigurationArgs(
        disable_password_authentication=True,
        ssh=compute.SshConfigurationArgs(
            public_keys=[
                compute.SshPublicKeyArgs(path=f"/home/{ADMIN_USERNAME}/.ssh/authorized_keys", key_data=key)
                for key in ssh_public_keys
            ]
        ),
    )


# Trusted Launch (Secure Boot) must stay off on every VM and scale set: the images boot an unsigned
# standalone GRUB (kilonode.image.disk.make_esp), and the GPU images' NVIDIA modules are built by
# DKMS and signed with a key enrolled nowhere (node-image/gpu/dkms/README.md); under Secure Boot
# the first would not boot and the second not load ("If Secure Boot fails to authenticate that the
# image is signed by a trusted publisher, the VM fails to boot": MicrosoftDocs/azure-compute-docs
# articles/virtual-machines/trusted-launch.md, "Secure Boot").
#
# It is not pinned off with securityType "Standard", because the compute API this program uses
# does not take it: pulumi-azure-native 3.29.0 (pyproject: >=3,<4) calls Microsoft.Compute
# 2024-11-01, whose SecurityTypes are TrustedLaunch and ConfidentialVM only (compute.SecurityTypes;
# its text: "If not specified, Standard will be returned starting api version 2025-11-01"). Azure
# documents "Standard" as the way to bypass the Trusted Launch default "using API version
# 2025-11-01 or higher" (trusted-launch.md, "Trusted Launch as default", "New behavior"); before
# it a subscription needs the feature Microsoft.Compute/UseStandardSecurityType for the value
# (Azure/azure-cli src/azure-cli/azure/cli/command_modules/vm/_params.py, `vm create
# --security-type` help). So securityType is left unset, and Azure's default at 2024-11-01
# applies: "Absence of securityProfile element in deployment code deploys VM & scale set without
# enabling Trusted launch" (trusted-launch.md, "Existing behavior"), unless the subscription is
# registered for Trusted Launch as default (Microsoft.Compute/TrustedLaunchByDefaultPreview): then
# a Gen2 VM or scale set whose image and size support Trusted Launch gets it, Secure Boot on. Do
# not register that feature on a kilonode subscription (docs/node-images.md). The image
# definitions declare no SecurityType feature (kilonode.azure.node_image).
# tests/azure/test_ssh_keys_and_encryption.py fails when the pinned package's SecurityTypes gains
# Standard: then set it here, explicitly, on every VM and scale set.


def security_profile(encryption_at_host: bool) -> compute.SecurityProfileArgs | None:
    """Encryption at host: the VM's temp disk and the host's cache of its OS and data disks
    encrypted at rest (platform-managed keys), where the plan says the size takes it
    (ClusterPlan.encryption_at_host). Not combinable with Azure Disk Encryption, which kilonode
    never uses ("Restrictions" of the encryption-at-host pages). No securityType: Trusted Launch is
    left to Azure's default at the pinned API version, which is off (the comment above)."""
    return compute.SecurityProfileArgs(encryption_at_host=True) if encryption_at_host else None


def tags(cluster: str, role: str) -> dict[str, str]:
    """Tags on every Azure resource, so cost reports and `az` queries can group by them."""
    return {"kilonode-cluster": cluster, "kilonode-role": role}


# --- storage accounts' network rules -----------------------------------------------------------
# Azure Storage network security ("Virtual network rules and IP network rules", MicrosoftDocs
# azure-docs, articles/storage/common/storage-network-security*): an IP rule takes public
# addresses only, never RFC 1918 space; /31 and /32 are not accepted as ranges (single addresses
# instead); IP rules do not match clients in the account's own region, whose traffic carries
# Azure-private addresses (a subnet there needs a service endpoint and a virtual network rule).
RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def storage_ip_rules(cidrs: Sequence[ipaddress.IPv4Network]) -> list[str]:
    """The storage IP rules that admit `cidrs`: a /31 or /32 as its single addresses, private
    (RFC 1918) ranges left out (Azure refuses them; such a source needs a virtual network rule)."""
    rules: list[str] = []
    for cidr in cidrs:
        if any(cidr.subnet_of(private) for private in RFC1918):
            continue
        if cidr.prefixlen >= 31:
            rules.extend(str(address) for address in cidr)
        else:
            rules.append(str(cidr))
    return rules


def storage_network_rules(ip_rules: Sequence[str], subnet_ids: Sequence[pulumi.Input[str]] = (), *,
                          azure_services: bool = False) -> storage.NetworkRuleSetArgs:
    """Deny by default; admit only these addresses and subnets, and with `azure_services` the
    platform's own trusted services (bypass AzureServices), which still need a right on the data."""
    return storage.NetworkRuleSetArgs(
        default_action=storage.DefaultAction.DENY,
        bypass=storage.Bypass.AZURE_SERVICES if azure_services else storage.Bypass.NONE,
        ip_rules=[storage.IPRuleArgs(i_p_address_or_range=rule, action=storage.Action.ALLOW)
                  for rule in ip_rules] or None,
        virtual_network_rules=[
            storage.VirtualNetworkRuleArgs(virtual_network_resource_id=s, action=storage.Action.ALLOW)
            for s in subnet_ids
        ] or None,
    )
