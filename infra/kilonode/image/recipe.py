"""The node image recipe (node-image/recipe.toml and its package lists), typed.

The recipe is data; this module only reads it and derives the base root filesystem's
cache inputs from it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kilonode.digest import sha256_file
from kilonode.image.vendor_apt import LOCK_NAME as APT_LOCK_NAME
from kilonode.image.vendor_apt import Repository, load_repositories
from kilonode.paths import NODE_IMAGE_DIR, node_image_lock

Runtime = Literal["docker", "containerd"]
# What a base root filesystem is built for: a pool's container runtime, or "control" for the
# etcd and control-plane images (their binaries are static releases: nothing past the base).
Flavour = Literal["docker", "containerd", "control"]
FLAVOURS: tuple[Flavour, ...] = ("docker", "containerd", "control")
# What a pool's VM size adds to its base (recipe.toml [extras.*]), in this order in a base's name.
Extra = Literal["gpu", "infiniband"]
EXTRAS: tuple[Extra, ...] = ("gpu", "infiniband")


@dataclass(frozen=True)
class ExtraSpec:
    """One [extras.<name>] table of recipe.toml."""

    name: Extra
    package_file: Path
    components: tuple[str, ...]  # deb822 components its packages need besides the host's
    dkms_modules: tuple[str, ...]  # DKMS modules that must be built for the image's kernel
    unsupported_models: dict[str, str]  # catalogue gpuModel -> why this extra cannot drive it
    # [extras.<name>.vendor]: packages from vendor apt repositories (installed by the build, not
    # the cached base), the packages that must be one driver release, and Fabric Manager's unit
    vendor_repositories: tuple[str, ...] = ()
    equal_versions: dict[str, str] = field(default_factory=dict)
    fabric_manager_unit: str | None = None
    # [extras.<name>.kernel]: the kernel this extra needs in place of the base's (image and headers
    # metapackages), or None: the base's kernel does
    kernel: Kernel | None = None
    # [extras.<name>.dkms_patches]: "<DKMS module>/<version>" -> patch files the DKMS build applies
    # (placed before the package is installed: rootfs.dkms_patch_hook)
    dkms_patches: dict[str, tuple[Path, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Kernel:
    """A Debian kernel flavour as two metapackages: the image a node boots, and the headers DKMS
    builds modules against (same flavour, same ABI)."""

    image: str
    headers: str


@dataclass(frozen=True)
class Declared:
    """A package as the recipe declares it: its version (None: whatever apt picks) and where."""

    version: str | None
    where: str  # "node-image/packages/gpu.txt", "node-image/recipe.toml [apt_repositories.<r>.packages]"


@dataclass(frozen=True)
class BaseSpec:
    """Which cached base root filesystem an image starts from: a flavour and its extras."""

    flavour: Flavour
    extras: tuple[Extra, ...] = ()

    def __post_init__(self) -> None:
        if tuple(e for e in EXTRAS if e in self.extras) != self.extras:
            raise ValueError(f"extras must be a subset of {EXTRAS} in that order, got {self.extras}")
        if self.extras and self.flavour == "control":
            raise ValueError("the control flavour (etcd, control-plane) takes no extras")

    @property
    def label(self) -> str:
        """docker, containerd+gpu, docker+gpu+infiniband: in logs, the manifest, `image prepare`."""
        return "+".join((self.flavour, *self.extras))


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
    extras: dict[str, ExtraSpec]
    # [kernel]: the flavour every image boots unless an extra names another ([extras.*.kernel])
    kernel: Kernel
    apt_repositories: dict[str, Repository] = field(default_factory=dict)

    @property
    def apt_lock_file(self) -> Path:
        """The sha256 each vendor .deb without a published pin had at its first fetch (in a
        user's project, its own node-image/apt.lock.toml: kilonode.paths.node_image_lock)."""
        return node_image_lock(APT_LOCK_NAME, self.root)

    def vendor_repositories(self, extras: tuple[Extra, ...]) -> list[Repository]:
        """The vendor apt repositories the extras take packages from, in the recipe's order."""
        names = dict.fromkeys(n for e in extras for n in self.extras[e].vendor_repositories)
        return [self.apt_repositories[n] for n in names]

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

    def extra_overlay_dir(self, extra: Extra) -> Path:
        """Static files copied into images with this extra only (node-image/<extra>/rootfs)."""
        return self.root / extra / "rootfs"

    def role_overlay_dir(self, role: str) -> Path:
        """Static files copied into one role's image only (node-image/roles/<role>/rootfs)."""
        return self.root / "roles" / role / "rootfs"

    def kernel_for(self, extras: tuple[Extra, ...] = ()) -> Kernel:
        """The kernel an image with these extras boots: the last extra that names one, else [kernel]."""
        named = [k for e in extras if (k := self.extras[e].kernel) is not None]
        return named[-1] if named else self.kernel

    def package_list(self, flavour: Flavour, extras: tuple[Extra, ...] = ()) -> list[str]:
        """The packages of the base: the flavour's lists and the extras', the kernel image being the
        one kernel_for names, and its headers where an extra builds DKMS modules."""
        kernel = self.kernel_for(extras)
        names = [kernel.image if n == self.kernel.image else n
                 for n in read_list(self.package_files["base"]) + read_list(self.package_files[flavour])]
        for extra in extras:
            names += read_list(self.extras[extra].package_file)
        if self.dkms_modules(extras):
            names.append(kernel.headers)
        return names

    def declared_packages(self, flavour: Flavour, extras: tuple[Extra, ...] = ()) -> dict[str, Declared]:
        """Every package an image of this flavour and extras is built with, by name: the version
        the recipe gives it (a list's `package=version`, apt's syntax; a vendor repository's
        exact version) or None, and the file and table that say so."""
        found: dict[str, Declared] = {}
        lists = [self.package_files["base"], self.package_files[flavour]]
        for path in [*lists, *(self.extras[e].package_file for e in extras)]:
            for entry in read_list(path):
                name, _, version = entry.partition("=")
                found[name] = Declared(version or None, self.shown(path))
        kernel = self.kernel_for(extras)
        if kernel != self.kernel:
            found.pop(self.kernel.image, None)
            where = next(f"node-image/recipe.toml [extras.{e}.kernel]" for e in reversed(extras)
                         if self.extras[e].kernel == kernel)
            found[kernel.image] = Declared(None, where)
        if self.dkms_modules(extras):
            found[kernel.headers] = Declared(None, "node-image/recipe.toml [kernel] / [extras.*.kernel] headers")
        for repo in self.vendor_repositories(extras):
            for pin in repo.packages:
                where = f"node-image/recipe.toml [apt_repositories.{repo.name}.packages]"
                found[pin.name] = Declared(pin.version, where)
        return found

    def shown(self, path: Path) -> str:
        """A recipe file as messages name it: node-image/<path>, or as given outside the recipe."""
        return f"node-image/{path.relative_to(self.root).as_posix()}" if path.is_relative_to(self.root) else str(path)

    def components(self, extras: tuple[Extra, ...]) -> tuple[str, ...]:
        """The deb822 components the extras need on top of the host's (sorted, unique)."""
        return tuple(sorted({c for e in extras for c in self.extras[e].components}))

    def dkms_modules(self, extras: tuple[Extra, ...]) -> tuple[str, ...]:
        return tuple(m for e in extras for m in self.extras[e].dkms_modules)

    def dkms_patches(self, extras: tuple[Extra, ...]) -> dict[str, tuple[Path, ...]]:
        """"<DKMS module>/<version>" -> the patch files its build applies, for these extras."""
        return {m: ps for e in extras for m, ps in self.extras[e].dkms_patches.items()}

    def base_inputs(
        self, flavour: Flavour, sources_sha256: str, extras: tuple[Extra, ...] = (), hook_sha256: str = ""
    ) -> dict[str, object]:
        """Everything the base root filesystem depends on; its sha256 is the cache key.

        The host's sources file enters as a hash only (a different mirror snapshot can
        mean different package versions), never as text; for a base with extras it is the
        derived copy's hash (the host's plus the extras' components). A base without extras
        hashes exactly what it hashed before extras existed, so its cache key is unchanged.
        """
        inputs: dict[str, object] = {
            "recipe_version": self.version,
            "suite": self.suite,
            "variant": self.variant,
            "flavour": flavour,
            "packages": self.package_list(flavour, extras),
            "package_files": {
                name: sha256_file(self.package_files[name]) for name in ("base", flavour)
            },
            "sources_sha256": sources_sha256,
        }
        if extras:
            inputs["extras"] = {
                e: {
                    "package_file": sha256_file(self.extras[e].package_file),
                    "components": list(self.extras[e].components),
                    "dkms_modules": list(self.extras[e].dkms_modules),
                    # the patches DKMS applies: their content is part of what the base is
                    **({"dkms_patches": {m: [sha256_file(p) for p in ps]
                                         for m, ps in self.extras[e].dkms_patches.items()}}
                       if self.extras[e].dkms_patches else {}),
                }
                for e in extras
            }
            # the customize hook (DKMS build and check) is code: its text enters the key too
            inputs["hook_sha256"] = hook_sha256
        return inputs


def read_list(path: Path) -> list[str]:
    """One package per line; '#' starts a comment."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names




def _extra(root: Path, name: str, table: dict[str, Any]) -> ExtraSpec:
    if name not in EXTRAS:
        raise ValueError(f"{root / 'recipe.toml'}: [extras.{name}]: unknown extra; known: {', '.join(EXTRAS)}")
    return ExtraSpec(
        name=name,  # type: ignore[arg-type]  # checked against EXTRAS above
        package_file=root / table["packages"],
        components=tuple(table.get("components", ())),
        dkms_modules=tuple(table.get("dkms_modules", ())),
        unsupported_models=dict(table.get("unsupported_models", {})),
        vendor_repositories=tuple(table.get("vendor", {}).get("repositories", ())),
        equal_versions=dict(table.get("vendor", {}).get("equal_versions", {})),
        fabric_manager_unit=table.get("vendor", {}).get("fabric_manager_unit"),
        kernel=Kernel(**table["kernel"]) if "kernel" in table else None,
        dkms_patches={module: tuple(root / p for p in patches)
                      for module, patches in table.get("dkms_patches", {}).items()},
    )


def load_recipe(root: Path = NODE_IMAGE_DIR) -> Recipe:
    data = tomllib.loads((root / "recipe.toml").read_text())
    repositories = load_repositories(data.get("apt_repositories", {}), root)
    extras = {name: _extra(root, name, table) for name, table in data.get("extras", {}).items()}
    for extra in extras.values():
        unknown = [r for r in extra.vendor_repositories if r not in repositories]
        if unknown:
            raise ValueError(f"{root / 'recipe.toml'}: [extras.{extra.name}.vendor] names no "
                             f"[apt_repositories.*] {', '.join(unknown)}")
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
        extras=extras,
        kernel=Kernel(**data["kernel"]),
        apt_repositories=repositories,
    )
