"""The node image recipe (node-image/recipe.toml and its package lists), typed.

The recipe is data; this module only reads it and derives the base root filesystem's
cache inputs from it.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kilonode.paths import NODE_IMAGE_DIR

Runtime = Literal["docker", "containerd"]
# What a base root filesystem is built for: a pool's container runtime, or "control" for the
# etcd and control-plane images (their binaries are static releases: nothing past the base).
Flavour = Literal["docker", "containerd", "control"]
FLAVOURS: tuple[Flavour, ...] = ("docker", "containerd", "control")


@dataclass(frozen=True)
class Recipe:
    root: Path
    version: int
    suite: str
    variant: str
    disk_size_mib: int
    esp_size_mib: int
    root_label: str
    kernel_cmdline: str
    package_files: dict[str, Path]
    enable_units: tuple[str, ...]
    disable_units: tuple[str, ...]

    @property
    def overlay_dir(self) -> Path:
        """Static files copied into every image at their host path."""
        return self.root / "rootfs"

    @property
    def pause_source(self) -> Path:
        return self.root / "pause" / "pause.c"

    @property
    def binaries_file(self) -> Path:
        """The pinned upstream binaries (kilonode.image.binaries reads it)."""
        return self.root / "binaries.toml"

    def role_overlay_dir(self, role: str) -> Path:
        """Static files copied into one role's image only (node-image/roles/<role>/rootfs)."""
        return self.root / "roles" / role / "rootfs"

    def package_list(self, flavour: Flavour) -> list[str]:
        return read_list(self.package_files["base"]) + read_list(self.package_files[flavour])

    def base_inputs(self, flavour: Flavour, sources_sha256: str) -> dict[str, object]:
        """Everything the base root filesystem depends on; its sha256 is the cache key.

        The host's sources file enters as a hash only (a different mirror snapshot can
        mean different package versions), never as text.
        """
        return {
            "recipe_version": self.version,
            "suite": self.suite,
            "variant": self.variant,
            "flavour": flavour,
            "packages": self.package_list(flavour),
            "package_files": {
                name: sha256_text(self.package_files[name]) for name in ("base", flavour)
            },
            "sources_sha256": sources_sha256,
        }


def read_list(path: Path) -> list[str]:
    """One package per line; '#' starts a comment."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def sha256_text(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_recipe(root: Path = NODE_IMAGE_DIR) -> Recipe:
    data = tomllib.loads((root / "recipe.toml").read_text())
    return Recipe(
        root=root,
        version=int(data["version"]),
        suite=data["suite"],
        variant=data["variant"],
        disk_size_mib=int(data["disk"]["size_mib"]),
        esp_size_mib=int(data["disk"]["esp_size_mib"]),
        root_label=data["disk"]["root_label"],
        kernel_cmdline=data["disk"]["kernel_cmdline"],
        package_files={name: root / rel for name, rel in data["packages"].items()},
        enable_units=tuple(data["units"]["enable"]),
        disable_units=tuple(data["units"]["disable"]),
    )
