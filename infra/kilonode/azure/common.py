"""Small pieces shared by the components: the admin login, the OS image reference, tags."""

from __future__ import annotations

import pulumi
from pulumi_azure_native import compute

# The login cloud-init creates on every VM and scale-set instance; SSH reaches it only from
# network.adminCidr (see Network), and only with the key Tls generates.
ADMIN_USERNAME = "kilonode"


def gallery_image(image_version_id: pulumi.Input[str]) -> compute.ImageReferenceArgs:
    """A VM's image: a version in the cluster's Compute Gallery (kilonode.azure.node_image)."""
    return compute.ImageReferenceArgs(id=image_version_id)


def linux_config(ssh_public_key: pulumi.Input[str]) -> compute.LinuxConfigurationArgs:
    """Key-only SSH for ADMIN_USERNAME; passwords are never set."""
    return compute.LinuxConfigurationArgs(
        disable_password_authentication=True,
        ssh=compute.SshConfigurationArgs(
            public_keys=[
                compute.SshPublicKeyArgs(
                    path=f"/home/{ADMIN_USERNAME}/.ssh/authorized_keys", key_data=ssh_public_key
                )
            ]
        ),
    )


def tags(cluster: str, role: str) -> dict[str, str]:
    """Tags on every Azure resource, so cost reports and `az` queries can group by them."""
    return {"kilonode-cluster": cluster, "kilonode-role": role}
