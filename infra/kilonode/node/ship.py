"""How a node program reaches its machine: the one table of what goes where and which image
carries it, read by every caller that ships one (the image build, the image needs and
preflight's `binaries` check, the VM checks).

A program's place in this folder and its name on the machine are separate on purpose: units,
goldens and running nodes know the machine's names (`python3 -m kilonode.gpu.agent`,
/usr/local/lib/kilonode/etcd_snapshot.py), and those do not move when the source does.
Two ways there:
- "image": written into the images named by `images` at build time (kilonode.image.build;
  `programs_for` says which programs an image carries); the rendered units only run it;
- "command": its source travels base64-encoded inside one shell command, for a check run over
  SSH on a VM (a testinfra `host.run` has no stdin, and the VM needs nothing installed).

No program travels in custom data: Azure caps a VM's custom data at 64 KiB
(kilonode.azure.custom_data), and each control-plane host's certificates, keys and kubeconfigs
already take most of it; the etcd members' custom data went over the limit with the snapshot
program (18 KB) and the certificate expiry program (6 KB) written inline. The preflight check
`custom-data-size` measures every host's.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

NODE_DIR = Path(__file__).resolve().parent

Delivery = Literal["image", "command"]

# The images a program is written into (NodeProgram.images): the role images by their names (the
# gallery image definitions of kilonode.config.model ROLE_IMAGES), every pool's image, a pool's
# image whose VM size adds an extra (the plan's NodePoolPlan.image_extras: "gpu", "infiniband"), or
# every image.
ETCD_IMAGE = "etcd"
CONTROL_PLANE_IMAGE = "control-plane"
ROLE_IMAGES = (ETCD_IMAGE, CONTROL_PLANE_IMAGE)
POOL_IMAGES = "pool"
EVERY_IMAGE = "every image"


def pool_image_with(extra: str) -> str:
    """The selector of the pool images whose VM size adds `extra` ("pool+gpu")."""
    return f"{POOL_IMAGES}+{extra}"


# The Python libraries a node program may import beyond the standard library and its own
# package: import name -> (Debian package, the line of node-image/packages/*.txt that brings it
# into the images). python3-yaml comes with cloud-init (a Depends of Debian's cloud-init), so
# every image has it; python3-numpy is in packages/gpu.txt, so GPU images only (the active check).
# python3-kubernetes and python3-cryptography are in packages/control.txt (the control-plane
# image: the node client approver).
NODE_LIBRARIES: dict[str, tuple[str, str]] = {
    "yaml": ("python3-yaml", "cloud-init"),
    "numpy": ("python3-numpy", "python3-numpy"),
    "kubernetes": ("python3-kubernetes", "python3-kubernetes"),
    "cryptography": ("python3-cryptography", "python3-cryptography"),
}
# Debian's interpreter on every image (cloud-init runs on it)
PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class NodeProgram:
    source: str  # a file or a package folder under kilonode/node/
    delivery: Delivery
    target: str | None = None  # its path on the machine ("command": none, it is never stored)
    # "image": the images that carry it (ETCD_IMAGE, CONTROL_PLANE_IMAGE, POOL_IMAGES,
    # pool_image_with(extra), EVERY_IMAGE); programs_for reads it
    images: tuple[str, ...] = ()
    mode: int = 0o644
    # a package's import root on the machine (the unit's PYTHONPATH), when it runs as `-m`
    pythonpath: str | None = None
    # files the machine needs beside it: (path, text)
    beside: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.delivery == "image" and not (self.images and self.target):
            raise ValueError(f"node/{self.source}: an image program names its images and its path on the machine")
        if self.delivery == "command" and (self.images or self.target):
            raise ValueError(f"node/{self.source}: a command program is stored in no image")
        known = {*ROLE_IMAGES, POOL_IMAGES, EVERY_IMAGE}
        unknown = [i for i in self.images if i not in known and not i.startswith(f"{POOL_IMAGES}+")]
        if unknown:
            raise ValueError(f"node/{self.source}: no image {', '.join(unknown)} (images: {', '.join(sorted(known))}, "
                             f"{POOL_IMAGES}+<extra>)")

    def carried_by(self, role_image: str | None, extras: Iterable[str] = ()) -> bool:
        """Whether the image of `role_image` (None: a pool's, its VM size adding `extras`) carries it."""
        if role_image is None:
            selectors = {EVERY_IMAGE, POOL_IMAGES, *(pool_image_with(e) for e in extras)}
        else:
            selectors = {EVERY_IMAGE, role_image}
        return bool(selectors & set(self.images))

    @property
    def path(self) -> Path:
        return NODE_DIR / self.source

    @property
    def machine_path(self) -> str:
        """Where it lives on the machine."""
        if self.target is None:
            raise ValueError(f"node/{self.source} travels in a command, not as a file")
        return self.target

    @property
    def module(self) -> str:
        """The import name on the machine (a package under `pythonpath`)."""
        if self.pythonpath is None:
            raise ValueError(f"node/{self.source} is not shipped as a package")
        return ".".join(PurePosixPath(self.machine_path).relative_to(self.pythonpath).parts)

    def files(self) -> list[tuple[str, bytes, int]]:
        """(path on the machine, content, mode) of every file it ships as: a package folder's
        .py and .toml files (the .toml are its data), or the one file."""
        target = self.machine_path
        found = [self.path]
        if self.path.is_dir():
            found = sorted(p for p in self.path.iterdir() if p.is_file() and p.suffix in (".py", ".toml"))
            if not any(p.name == "__init__.py" for p in found):
                raise FileNotFoundError(f"{self.path}: not a package (no __init__.py)")
        shipped = [(f"{target}/{p.name}" if self.path.is_dir() else target, p.read_bytes(), self.mode)
                   for p in found]
        return [*((path, text.encode(), 0o644) for path, text in self.beside), *shipped]

    def command(self, args: list[str], python: str = "python3") -> str:
        """A shell command that runs this file as __main__ with `python` and `args`."""
        if self.delivery != "command" or self.path.is_dir():
            raise ValueError(f"node/{self.source} is not shipped in a command")
        source = base64.b64encode(self.path.read_bytes()).decode()
        loader = f'import base64; exec(compile(base64.b64decode("{source}"), "{self.path.name}", "exec"))'
        return " ".join([python, "-c", shlex.quote(loader), *(shlex.quote(a) for a in args)])


# Every image: kilonode-local-disk.service runs it at boot (node-image/rootfs).
LOCAL_DISK_SETUP = NodeProgram("local_disk_setup.py", "image", target="/usr/local/lib/kilonode/local-disk-setup",
                               mode=0o755, images=(EVERY_IMAGE,))
# The GPU health agent (GPU pools, kilonode-gpu-health.service in node-image/gpu/rootfs) and its
# taint controller (apiservers: the control-plane image), as the package kilonode.gpu.
GPU_HEALTH = NodeProgram(
    "gpu", "image", target="/usr/local/lib/kilonode/python/kilonode/gpu",
    images=(pool_image_with("gpu"), CONTROL_PLANE_IMAGE),
    pythonpath="/usr/local/lib/kilonode/python",
    # a stand-in for the real kilonode/__init__.py, which belongs to the whole CLI: the image
    # carries only kilonode.gpu, and this file must import nothing else
    beside=(("/usr/local/lib/kilonode/python/kilonode/__init__.py",
             '"""kilonode on a node: only the GPU health agent and taint controller (kilonode.gpu),\n'
             'copied by `kilonode image build`. The rest of kilonode runs where clusters are built."""\n'),),
)
# The node client certificate approver (kilonode-node-client-approver.service on every apiserver
# VM): a package of its own import root, so it shares no kilonode/__init__.py with kilonode.gpu.
NODE_CLIENT_APPROVER = NodeProgram(
    "node_client_approver", "image", target="/usr/local/lib/kilonode/approver/node_client_approver",
    images=(CONTROL_PLANE_IMAGE,), pythonpath="/usr/local/lib/kilonode/approver",
)
# Every etcd member runs it from its timer and unit, with its config (kilonode.render.etcd_snapshot).
ETCD_SNAPSHOT = NodeProgram("etcd_snapshot.py", "image", target="/usr/local/lib/kilonode/etcd_snapshot.py",
                            mode=0o755, images=(ETCD_IMAGE,))
# Every control-plane host (etcd members and apiservers): the expiry of the certificates it serves
# and uses, one answer per scrape (kilonode.render.cert_metrics, rendered by kilonode.render.etcd
# and kilonode.render.control_plane).
CERT_EXPIRY = NodeProgram("cert_expiry.py", "image", target="/usr/local/lib/kilonode/cert-metrics", mode=0o755,
                          images=(ETCD_IMAGE, CONTROL_PLANE_IMAGE))
# Every pool node: per-pod traffic counters, kept in line with azure-vnet's state and answered
# per scrape (kilonode.render.pod_traffic).
POD_TRAFFIC = NodeProgram("pod_traffic.py", "image", target="/usr/local/lib/kilonode/pod-traffic", mode=0o755,
                          images=(POOL_IMAGES,))
# The ARP lesson's fill, on the VM `kilonode image verify` booted (kilonode.image.arp_lesson).
ARP_GUEST = NodeProgram("arp_guest.py", "command")

# In the order an image build places them.
PROGRAMS = (LOCAL_DISK_SETUP, GPU_HEALTH, NODE_CLIENT_APPROVER, ETCD_SNAPSHOT, CERT_EXPIRY, POD_TRAFFIC, ARP_GUEST)


def programs_for(role_image: str | None, extras: Iterable[str] = ()) -> tuple[NodeProgram, ...]:
    """The node programs written into an image: a role image's (`role_image`, one of ROLE_IMAGES),
    or a pool's (None) with the extras its VM size adds. The image build places these and the
    image needs (kilonode.image.needs, preflight's `binaries`) count them as provided."""
    if role_image is not None and role_image not in ROLE_IMAGES:
        raise ValueError(f"no role image {role_image!r} (role images: {', '.join(ROLE_IMAGES)}; None: a pool's)")
    return tuple(p for p in PROGRAMS if p.delivery == "image" and p.carried_by(role_image, tuple(extras)))
