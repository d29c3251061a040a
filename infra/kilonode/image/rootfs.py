"""The base root filesystem (mmdebstrap, cached) and what every build does on top of it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kilonode.digest import sha256_file, sha256_text
from kilonode.image import cache, mirror
from kilonode.image.recipe import FLAVOURS, BaseSpec, Extra, Recipe
from kilonode.node.ship import NodeProgram
from kilonode.problems import BuildError


@dataclass(frozen=True)
class BaseRootfs:
    tarball: Path
    key: str
    cached: bool  # True when an earlier build made it


# Set (the test suite sets it) to forbid reaching the package mirror: a missing cache entry
# is then an error naming `make test-artefacts`, never a download in the middle of a test.
NO_MIRROR_ENV = "KILONODE_NO_MIRROR"


def prepare(
    recipe: Recipe, log: Callable[[str], None], extra_bases: tuple[BaseSpec, ...] = ()
) -> list[BaseRootfs]:
    """Build (or find) the cached base root filesystem of every flavour, and of the flavour+extras
    combinations given (those some stack's pools use): `kilonode image prepare`."""
    specs = [BaseSpec(flavour) for flavour in FLAVOURS]
    specs += [spec for spec in dict.fromkeys(extra_bases) if spec not in specs]
    return [base_rootfs(recipe, spec, log) for spec in specs]


# Run by mmdebstrap after every package is installed (its customize hook; "$1" is the new root).
# In a chroot `uname -r` is the build host's kernel; Debian's dkms common.postinst then builds for
# the newest installed kernel only on a first install ("It is likely that <host kernel> belongs
# to a chroot's host ... Building for 6.1.0-56-cloud-amd64", measured), not on an upgrade. So the
# hook does not rely on it: `dkms autoinstall -k` builds (or skips, when built) every registered
# module for each kernel the image has, then each required module must exist under that
# kernel's updates/dkms/, or the base is not made at all.
DKMS_HOOK = r"""set -eu
root="$1"
for kver in $(ls "$root/lib/modules"); do
  # build is an absolute link into the image's /usr/src: test it inside the image
  if ! chroot "$root" test -e "/lib/modules/$kver/build"; then
    echo "kilonode: no kernel headers for the image's kernel $kver: DKMS cannot build for it" >&2; exit 1
  fi
  chroot "$root" dkms autoinstall -k "$kver" >&2
  for module in @MODULES@; do
    if ! ls "$root/lib/modules/$kver/updates/dkms/$module.ko"* >/dev/null 2>&1; then
      echo "kilonode: DKMS did not build $module.ko for the image's kernel $kver" >&2
      chroot "$root" dkms status >&2 || true
      exit 1
    fi
  done
done
"""


def dkms_hook(modules: tuple[str, ...]) -> str:
    return DKMS_HOOK.replace("@MODULES@", " ".join(modules))


def dkms_patch_hook(patches: dict[str, tuple[Path, ...]]) -> str:
    """mmdebstrap's setup hook (before any package is installed) that puts each DKMS patch where
    DKMS looks for it, /usr/src/<module>-<version>/patches/ (dpkg unpacks the package's source
    into that directory beside it), and names it in /etc/dkms/<module>-<version>.conf, which DKMS
    sources after the package's own dkms.conf (dkms 3.0.10 read_conf: "user-specified overrides");
    so the first build, the package's postinst, already applies it. Empty without patches."""
    lines = ["set -eu", 'root="$1"']
    for module_version, files in sorted(patches.items()):
        module, _, version = module_version.partition("/")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", module) or not re.fullmatch(r"[0-9][0-9a-z.+~-]*", version):
            raise BuildError(f"recipe.toml dkms_patches: {module_version!r} is not <module>/<version>")
        src = f'"$root/usr/src/{module}-{version}/patches"'
        lines.append(f"mkdir -p {src} \"$root/etc/dkms\"")
        conf = [f'PATCH[{i}]="{path.name}"' for i, path in enumerate(files)]
        lines += [f"cp {shlex.quote(str(path))} {src}/{shlex.quote(path.name)}" for path in files]
        lines.append(f"printf '%s\\n' {' '.join(shlex.quote(c) for c in conf)} "
                     f'> "$root/etc/dkms/{module}-{version}.conf"')
    return "\n".join(lines) + "\n" if patches else ""


def derive_sources(text: str, components: tuple[str, ...]) -> str:
    """The host's deb822 sources with `components` added to every stanza's Components field
    (each once, order kept): the extras' packages live in components the host may not enable.
    Used only for bases with extras, so the others keep building from the host's own file."""
    lines = []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "components" and not line[:1].isspace():
            have = value.split()
            line = f"{name}: " + " ".join([*have, *(c for c in components if c not in have)])
        lines.append(line)
    return "\n".join(lines) + "\n"


def base_rootfs(recipe: Recipe, spec: BaseSpec, log: Callable[[str], None]) -> BaseRootfs:
    """The mmdebstrap tarball for (recipe, flavour, extras), built once per cache key."""
    host_sources = mirror.sources_file()
    extras: tuple[Extra, ...] = spec.extras
    hook = dkms_hook(recipe.dkms_modules(extras)) if recipe.dkms_modules(extras) else ""
    setup_hook = dkms_patch_hook(recipe.dkms_patches(extras))
    sources_text = (
        derive_sources(host_sources.read_text(), recipe.components(extras)) if extras else None
    )
    sources_sha = (
        sha256_text(sources_text) if sources_text is not None
        else sha256_file(host_sources)
    )
    inputs = recipe.base_inputs(
        spec.flavour, sources_sha, extras, hook_sha256=sha256_text(hook) if extras else ""
    )
    key = cache.key_of(inputs)
    tarball = cache.entry("rootfs", key, "tar")
    if tarball.is_file():
        return BaseRootfs(tarball, key, cached=True)
    if os.environ.get(NO_MIRROR_ENV):
        raise BuildError(
            f"the {spec.label} base root filesystem ({key[:12]}) is not in the cache, and {NO_MIRROR_ENV} forbids "
            "reaching the package mirror (tests set it): run `make test-artefacts` (it runs `kilonode image prepare`)"
        )
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap not found: run `make setup` (installs .ci/debian-packages.txt)")
    # mmdebstrap picks its output format from the name: keep ".tar" last, and say it too
    partial = tarball.with_name(f"{key}.partial.tar")
    packages = recipe.package_list(spec.flavour, extras)
    with tempfile.TemporaryDirectory(prefix="kilonode-sources-") as tmp:
        sources = host_sources
        if sources_text is not None:
            # the derived copy names the mirror: it lives in a private temporary directory for
            # the length of this call, never in the repository, the cache or the image
            sources = Path(tmp) / "debian.sources"
            sources.write_text(sources_text)
        cmd = [
            "mmdebstrap", "--quiet", "--format=tar", f"--variant={recipe.variant}",
            f"--include={','.join(packages)}",
            *([f"--setup-hook={setup_hook}"] if setup_hook else []),
            *([f"--customize-hook={hook}"] if hook else []),
            recipe.suite, str(partial), str(sources),
        ]
        log(f"mmdebstrap {recipe.suite} for {spec.label} ({len(packages)} packages requested) -> cache {key[:12]}")
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        # apt's messages name the mirror: scrub before showing them.
        raise BuildError(f"mmdebstrap failed for the {spec.label} base:\n" + mirror.scrub(_failure(result.stderr)))
    partial.rename(tarball)
    # beside the tarball: what it was built from, for a human wondering what a key means
    tarball.with_suffix(".inputs.json").write_text(json.dumps(inputs, indent=2, sort_keys=True))
    return BaseRootfs(tarball, key, cached=False)


def _failure(stderr: str, limit: int = 4000) -> str:
    """What to show of mmdebstrap's stderr: the lines that name an error (a package's maintainer
    script, DKMS, dpkg; they come long before the end) and the last lines."""
    lines = stderr.splitlines()
    errors = [line for line in lines if re.search(r"\b(error|failed|E:|dpkg:|kilonode:)", line, re.IGNORECASE)]
    text = "\n".join([*errors[:30], "...", *lines[-15:]])
    return text[-limit:]


def extract(tarball: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # --numeric-owner: the image's uids, not the build host's names; xattrs keep file caps.
    result = subprocess.run(
        ["tar", "-C", str(dest), "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", str(tarball)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"unpacking {tarball} failed: {result.stderr.strip()[-2000:]}")


def host_path(root: Path, path: str) -> Path:
    """`path` (absolute or relative to /) inside the tree at `root`, never outside it."""
    rel = Path(path.lstrip("/"))
    if ".." in rel.parts:
        raise BuildError(f"refusing path outside the image: {path}")
    return root / rel


def put(root: Path, path: str, data: bytes, mode: int) -> Path:
    target = host_path(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_bytes(data)
    os.chmod(target, mode)
    os.chown(target, 0, 0)
    return target


def copy_overlay(overlay: Path, root: Path) -> list[str]:
    """Copy the recipe's static files; returns their host paths."""
    placed = []
    for src in sorted(p for p in overlay.rglob("*") if p.is_file()):
        rel = "/" + src.relative_to(overlay).as_posix()
        put(root, rel, src.read_bytes(), 0o755 if os.access(src, os.X_OK) else 0o644)
        placed.append(rel)
    return placed


def place_program(root: Path, program: NodeProgram) -> list[dict[str, str]]:
    """Write a node program where kilonode.node.ship says it lives on the machine; returns its
    artefact entries (path, sha256, mode, source) for the manifest."""
    entries = []
    for path, data, mode in program.files():
        put(root, path, data, mode)
        entries.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "mode": f"{mode:04o}",
                        "source": f"node:{program.source}"})
    return entries


def systemctl(root: Path, verb: str, units: tuple[str, ...] | list[str]) -> None:
    if not units:
        return
    result = subprocess.run(
        ["systemctl", f"--root={root}", verb, *units], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"systemctl --root {verb} {' '.join(units)} failed: {result.stderr.strip()}")


def sysusers(root: Path, configs: list[str]) -> None:
    """Create the service users that these sysusers.d files (host paths in the tree) declare,
    in the tree itself; the packages' own users are already there."""
    if not configs:
        return
    result = subprocess.run(
        ["systemd-sysusers", f"--root={root}", *(str(host_path(root, c)) for c in configs)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"systemd-sysusers --root {root} failed: {result.stderr.strip()[-2000:]}")


def scrub_image(root: Path) -> None:
    """Image hygiene: nothing that identifies the build host or one particular node.

    - machine-id empty: systemd makes a fresh one on each VM's first boot; a shared one
      breaks DHCP client IDs and journald on every node built from the image.
    - no SSH host keys: every node would share them (cloud-init makes new ones).
    - no apt sources, mmdebstrap apt options, apt lists: they name the build's mirror.
    - hostname from the build host removed (cloud-init sets the node's).
    - root has no password ('*' can never match).
    """
    machine_id = root / "etc/machine-id"
    machine_id.write_text("")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for pattern in ("etc/apt/sources.list", "etc/apt/sources.list.d/*.list", "etc/apt/sources.list.d/*.sources",
                    "etc/apt/apt.conf.d/99mmdebstrap", "var/lib/apt/lists/*", "var/cache/apt/*.bin",
                    "etc/hostname", "var/log/apt/*", "var/log/dpkg.log", "var/log/alternatives.log",
                    "var/log/bootstrap.log"):
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    lists = root / "var/lib/apt/lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    shadow = root / "etc/shadow"
    lines = []
    for line in shadow.read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 1 and fields[1] not in ("*", "!", "!*") and not fields[1].startswith("!"):
            fields[1] = "*"
        lines.append(":".join(fields))
    shadow.write_text("\n".join(lines) + "\n")


def conffile_hashes(root: Path) -> dict[str, str]:
    """md5 of every dpkg conffile as packaged: a hit there is Debian's text, not the build's."""
    hashes: dict[str, str] = {}
    status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    in_conffiles = False
    for line in status.splitlines():
        if line.startswith("Conffiles:"):
            in_conffiles = True
            continue
        if in_conffiles and line.startswith(" "):
            parts = line.split()
            if len(parts) >= 2:
                hashes[parts[0]] = parts[1]
            continue
        in_conffiles = False
    return hashes


def find_mirror_names(root: Path, hosts: list[str]) -> list[str]:
    """Files in the image (outside /usr's packaged data) that name a build-host mirror."""
    if not hosts:
        return []
    needles = [h.encode().lower() for h in hosts]
    packaged = conffile_hashes(root)
    hits = []
    for top in ("etc", "var", "root", "opt", "usr/local", "boot/grub"):
        base = root / top
        if not base.exists():
            continue
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    continue
                try:
                    data = path.read_bytes().lower()
                except OSError:
                    continue
                if any(n in data for n in needles):
                    rel = "/" + path.relative_to(root).as_posix()
                    if packaged.get(rel) == hashlib.md5(path.read_bytes()).hexdigest():
                        continue
                    hits.append(rel)
    return sorted(hits)


def installed_packages(root: Path) -> dict[str, str]:
    """name -> version from the image's dpkg status (no chroot needed)."""
    packages: dict[str, str] = {}
    name = version = status = ""
    for line in [*(root / "var/lib/dpkg/status").read_text(errors="replace").splitlines(), ""]:
        if line.startswith("Package:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
        elif line.startswith("Status:"):
            status = line.split(":", 1)[1].strip()
        elif not line:
            if name and status.endswith(" installed"):
                packages[name] = version
            name = version = status = ""
    return dict(sorted(packages.items()))
