"""What a machine's files run, and what its image provides: the programs the rendered units,
drop-ins, CNI conflists, runtime configs and scripts invoke (a unit's Python script or module
too), and for each path where it comes from in the image of that role (a pinned or locked
component of node-image/binaries.toml, a Debian package of the recipe, a file of the recipe's
overlays, a node program the image carries (kilonode.node.ship programs_for) or the render itself).

The image build refuses an image missing one (kilonode.image.build), and preflight's
`binaries` check follows the same chain offline for every role of a render.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from kilonode.catalog.binaries import LOCK_NAME, Catalog, Component, PinError, load
from kilonode.image.recipe import Extra, Flavour, Recipe
from kilonode.node.ship import programs_for
from kilonode.paths import shown_lock

# "interpreted": the script or module a unit's interpreter runs (`python3 /path/prog`, `python3 -m
# pkg.mod` under the unit's PYTHONPATH): the interpreter starts, and exits at once without it
Kind = Literal["unit", "interpreted", "cni", "ipam", "runtime", "script"]
EXEC_KEYS = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost")
# cri-dockerd's default --cni-bin-dir (cmd/cri/options/options.go at v0.3.25 l.110) and
# containerd's CRI default bin_dir (pkg/cri/config/config_unix.go): the same directory.
DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
# systemd's default PATH for services (systemd.exec(5), "Environment variables in spawned
# processes"), on a merged-/usr system: where a bare command name is looked up.
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin")
SCRIPTS_DIR = "usr/local/lib/kilonode/"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
DOCKER_CONFIG = "etc/docker/daemon.json"


@dataclass(frozen=True)
class Need:
    """A program one of the machine's files runs: any of `paths` will do."""

    paths: tuple[str, ...]
    kind: Kind
    file: str  # the machine path of the file naming it
    why: str  # how that file names it: "ExecStart", "plugin type azure-vnet", ...
    cni_version: str | None = None  # a conflist plugin: the spec version the conflist asks for
    plugin: str | None = None  # a conflist plugin's type

    @property
    def path(self) -> str:
        return self.paths[0]


def runtime_of(files: Mapping[str, str]) -> str:
    """A pool host's runtime, from its files: containerd has its config rendered."""
    return "containerd" if CONTAINERD_CONFIG in files else "docker"


def unit_directives(text: str) -> list[tuple[str, str]]:
    """(key, value) of every `Key=value` line of a unit file, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and line[0] not in "#;[" and "=" in line:
            key, _, value = line.partition("=")
            found.append((key.strip(), value.strip()))
    return found


def _exec_program(value: str) -> str | None:
    """The program of an Exec*= value: its prefixes (-@:+!) stripped; None for a reset."""
    words = value.lstrip("-@:+!|").split()
    return words[0] if words else None


def _interpreted(where: str, key: str, value: str, pythonpath: list[str]) -> list[Need]:
    """What a Python interpreter in an Exec*= value runs (python(1), "Interface options"): the
    script file named by its first argument that is no option, or with `-m` the module, looked up
    under the unit's PYTHONPATH (a module found in the standard library's own path is not
    reported). Nothing for `-c`, nor for any other program."""
    words = value.lstrip("-@:+!|").split()
    if not words or not PurePosixPath(words[0]).name.startswith("python"):
        return []
    for index, word in enumerate(words[1:], start=1):
        if word == "-c":
            return []
        if word == "-m" and index + 1 < len(words):
            module = words[index + 1].replace(".", "/")
            paths = tuple(p for d in pythonpath for p in (f"{d}/{module}.py", f"{d}/{module}/__init__.py"))
            return [Need(paths, "interpreted", where, f"{key} module {words[index + 1]}")] if paths else []
        if not word.startswith("-"):
            return [Need((word,), "interpreted", where, f"{key} script")] if word.startswith("/") else []
    return []


def _unit_needs(where: str, text: str) -> list[Need]:
    """Each Exec*= program of a unit or drop-in, and the script or module its interpreter runs."""
    directives = unit_directives(text)
    pythonpath = [d for key, value in directives if key == "Environment"
                  for assignment in (a.strip('"') for a in value.split()) if assignment.startswith("PYTHONPATH=")
                  for d in assignment.removeprefix("PYTHONPATH=").split(":") if d.startswith("/")]
    needs = []
    for key, value in directives:
        if key in EXEC_KEYS and (program := _exec_program(value)):
            needs.append(Need(_alternatives(program), "unit", where, key))
            needs += _interpreted(where, key, value, pythonpath)
    return needs


def _alternatives(program: str) -> tuple[str, ...]:
    return (program,) if program.startswith("/") else tuple(f"{d}/{program}" for d in SERVICE_PATH)


def cni_bin_dirs(files: Mapping[str, str]) -> tuple[str, ...]:
    """Where the runtime looks for CNI plugins: cri-dockerd's --cni-bin-dir (a comma list,
    config/options.go), containerd's [plugins."io.containerd.grpc.v1.cri".cni] bin_dir; the
    default otherwise."""
    if runtime_of(files) == "containerd":
        config = tomllib.loads(files[CONTAINERD_CONFIG])
        cri = config.get("plugins", {}).get("io.containerd.grpc.v1.cri", {})
        return (str(cri.get("cni", {}).get("bin_dir", DEFAULT_CNI_BIN_DIR)),)
    for path, text in files.items():
        if path.endswith("cri-docker.service"):
            for key, value in unit_directives(text):
                if key == "ExecStart" and (flag := re.search(r"--cni-bin-dir[= ](\S+)", value)):
                    return tuple(d for d in flag.group(1).split(",") if d)
    return (DEFAULT_CNI_BIN_DIR,)


def programs_invoked(files: Mapping[str, str], known: Iterable[str] = ()) -> list[Need]:
    """Every program the host's files run (files: machine path without the leading "/" ->
    text). `known`: program names a shell script's bare commands are matched against (a
    word no provider knows may be a builtin or a function: not reported)."""
    needs: list[Need] = []
    bin_dirs = cni_bin_dirs(files)
    for path, text in sorted(files.items()):
        where = "/" + path
        if path.startswith("etc/systemd/system/") and path.endswith((".service", ".conf")):
            needs += _unit_needs(where, text)
        elif path.startswith("etc/cni/net.d/") and path.endswith(".conflist"):
            needs += _conflist_needs(where, json.loads(text), bin_dirs)
        elif path == DOCKER_CONFIG:
            runtimes = json.loads(text).get("runtimes") or {}
            needs += [Need(_alternatives(str(r["path"])), "runtime", where, f"runtimes.{name}.path")
                      for name, r in sorted(runtimes.items()) if r.get("path")]
        elif path == CONTAINERD_CONFIG:
            needs += _containerd_needs(where, tomllib.loads(text))
        elif path.startswith(SCRIPTS_DIR):
            needs += _script_needs(where, text, set(known))
    return needs


def _conflist_needs(where: str, conflist: dict[str, Any], bin_dirs: tuple[str, ...]) -> list[Need]:
    version = str(conflist.get("cniVersion", ""))
    needs = []
    for plugin in conflist.get("plugins", []):
        kind = plugin.get("type")
        if kind:
            needs.append(Need(tuple(f"{d}/{kind}" for d in bin_dirs), "cni", where, f"plugin type {kind}",
                              version, kind))
        ipam = (plugin.get("ipam") or {}).get("type")
        if ipam:
            needs.append(Need(tuple(f"{d}/{ipam}" for d in bin_dirs), "ipam", where,
                              f"plugin {kind}'s ipam.type {ipam}", version, ipam))
    return needs


def _containerd_needs(where: str, config: dict[str, Any]) -> list[Need]:
    cri = config.get("plugins", {}).get("io.containerd.grpc.v1.cri", {})
    needs = []
    for name, runtime in sorted((cri.get("containerd", {}).get("runtimes") or {}).items()):
        binary = (runtime.get("options") or {}).get("BinaryName")
        if binary:
            needs.append(Need(_alternatives(binary), "runtime", where, f"runtimes.{name}.options.BinaryName"))
        if runtime.get("runtime_type") == "io.containerd.runc.v2":
            # containerd starts the shim by name from its PATH (runtime/v2/shim naming rule)
            needs.append(Need(_alternatives("containerd-shim-runc-v2"), "runtime", where,
                              f"runtimes.{name}.runtime_type io.containerd.runc.v2"))
    return needs


def _script_needs(where: str, text: str, known: set[str]) -> list[Need]:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!"):
        return []
    interpreter = lines[0][2:].split()
    needs = [Need((interpreter[0],), "script", where, "#! interpreter")] if interpreter else []
    if not interpreter or not interpreter[0].endswith("sh"):
        return needs
    body = "\n".join(line for line in lines[1:] if not line.lstrip().startswith("#"))
    paths = sorted(set(re.findall(r"(?<![\w/.-])(/(?:usr/)?(?:local/)?s?bin/[\w.+-]+)", body)))
    needs += [Need((p,), "script", where, f"runs {p}") for p in paths]
    # bare commands: a known program's name at the start of a command
    words = set(re.findall(r"(?:^|[;&|(]|\$\(|\bif|\bthen|\bdo|!)\s*([a-z][\w.-]*)", body, re.MULTILINE))
    needs += [Need(_alternatives(w), "script", where, f"runs {w}") for w in sorted(words & known)]
    return needs


# --- what the image of a role provides ---------------------------------------------------------

__all__ = ["Catalog"]  # for preflight, which reads the binaries data through this module


def load_catalog(recipe: Recipe) -> Catalog:
    """The binaries data (and its lock) the recipe's images are built from."""
    return load(recipe.binaries_file)


Status = Literal["ok", "unverified", "missing"]


@dataclass(frozen=True)
class Provider:
    status: Status
    what: str  # where it comes from, or why it does not


@dataclass(frozen=True)
class ImageSpec:
    """The image a machine boots, as far as what it carries: its binaries.toml roles, the
    recipe's flavour and extras (the package lists), and the files it is given."""

    roles: tuple[str, ...]
    flavour: Flavour
    extras: tuple[Extra, ...]
    kubernetes_version: str


def component_provider(catalog: Catalog, component: Component, kubernetes_version: str) -> Provider:
    """Whether a component of the role reaches the image, by the data alone (no built image):
    pinned, locked, unverified (locked but no digest recorded yet) or missing."""
    name = f"{component.name} {component.version or ''}".strip()
    if component.lock:
        entry = catalog.lock_entry(component)
        if entry is not None:
            return Provider("ok", f"{name}, locked (sha256 {entry.sha256[:12]}..., recorded {entry.recorded})")
        return Provider("unverified", f"{name} unverified: no digest yet; the first `kilonode image build --fetch` "
                                      f"records it in {shown_lock(LOCK_NAME)}")
    if component.unpinned:
        return Provider("missing", f"{name}: no delivery path (not pinned: {component.unpinned}); only "
                                   "`--binaries DIR` places it")
    try:
        pin = component.pin_for(kubernetes_version, catalog.arch)
    except PinError as error:
        return Provider("missing", str(error))
    return Provider("ok", f"{component.name} {pin.version}, pinned ({pin.algorithm} from {pin.source})")


def overlay_paths(recipe: Recipe, spec: ImageSpec, role_image: str | None) -> set[str]:
    """Machine paths of the recipe's overlays for the image and the node programs it ships."""
    dirs = [recipe.overlay_dir, *(recipe.extra_overlay_dir(e) for e in spec.extras)]
    if role_image:
        dirs.append(recipe.role_overlay_dir(role_image))
    found = {"/" + p.relative_to(d).as_posix() for d in dirs if d.is_dir() for p in d.rglob("*") if p.is_file()}
    return found | {path for program in programs_for(role_image, spec.extras) for path, _, _ in program.files()}


def providers(catalog: Catalog, recipe: Recipe, spec: ImageSpec) -> dict[str, Provider]:
    """Every path the image provides by the data: its components' files and the Debian
    packages its lists and its extras' vendor apt repositories install."""
    found: dict[str, Provider] = {}
    packages = {entry.split("=", 1)[0] for entry in recipe.package_list(spec.flavour, spec.extras)}
    packages |= {p.name for r in recipe.vendor_repositories(spec.extras) for p in r.packages}
    for path, deb in catalog.debian.items():
        listed = sorted(packages & set(deb.packages))
        if deb.essential or listed:
            found[path] = Provider("ok", f"Debian package {(listed or deb.packages)[0]} ({deb.source})")
        else:
            base = "+".join((spec.flavour, *spec.extras))
            found[path] = Provider("missing", f"Debian package {' or '.join(deb.packages)} is not in the recipe's "
                                              f"package lists for {base}")
    for role in spec.roles:
        for component in catalog.role(role):
            provider = component_provider(catalog, component, spec.kubernetes_version)
            for f in component.expanded_files(catalog.arch):
                found[f.path] = provider
    return found


def known_programs(catalog: Catalog) -> set[str]:
    """Every program name a component or a Debian package provides (scripts' bare commands)."""
    names = {PurePosixPath(p).name for p in catalog.debian}
    names |= {PurePosixPath(f.path).name for c in catalog.components.values() for f in c.expanded_files(catalog.arch)}
    return names


def packaged_units(catalog: Catalog, recipe: Recipe, spec: ImageSpec) -> set[str]:
    """The systemd units the image's Debian packages install (docker.service, ...)."""
    packages = set(recipe.package_list(spec.flavour, spec.extras))
    return {u for d in catalog.debian.values() if set(d.packages) & packages for u in d.units}
