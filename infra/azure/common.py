"""Small pieces shared by the components: the admin login, the OS image reference, tags."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import compute

from kilonode.config.model import MarketplaceImageConfig

# The login cloud-init creates on every VM and scale-set instance; SSH reaches it only from
# network.adminCidr (see Network), and only with the key Tls generates.
ADMIN_USERNAME = "kilonode"


@dataclass(frozen=True)
class MarketplaceImage:
    """A marketplace image for the control-plane VMs (etcd, apiservers)."""

    publisher: str
    offer: str
    sku: str
    version: str

    @classmethod
    def of(cls, image: MarketplaceImageConfig) -> MarketplaceImage:
        return cls(publisher=image.publisher, offer=image.offer, sku=image.sku, version=image.version)

    @property
    def urn(self) -> str:
        """publisher:offer:sku:version, as `az vm create --image` takes it."""
        return f"{self.publisher}:{self.offer}:{self.sku}:{self.version}"

    def reference(self) -> compute.ImageReferenceArgs:
        return compute.ImageReferenceArgs(
            publisher=self.publisher, offer=self.offer, sku=self.sku, version=self.version
        )




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
