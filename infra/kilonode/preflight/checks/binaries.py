"""binaries: every program a machine's files run exists in the image that machine boots, at a
version that works with the rest.

For every role of the render (etcd-*, apiserver-*, pool-*), the check collects what its files
invoke: each unit's and drop-in's ExecStartPre/ExecStart/ExecStartPost/ExecReload/ExecStop
programs, and the script or module a unit's python3 runs (its first argument that is no option,
or `-m` under the unit's PYTHONPATH: the node programs of kilonode.node.ship); each CNI
conflist plugin's `type` AND its nested `ipam.type`, in the CNI bin dir the runtime searches
(cri-dockerd's `--cni-bin-dir`, default /opt/cni/bin; containerd's CRI `bin_dir`); the
runtime paths of the active runtime config (Docker's daemon.json `runtimes.*.path`,
containerd's `BinaryName` and its runc shim); the interpreter of every script under
/usr/local/lib/kilonode and the programs a shell script runs (absolute paths, and bare
commands named like a program the image could carry). Each must come from one of:

- a component of node-image/binaries.toml for that role, pinned for the stack's Kubernetes
  version with its digest, or locked (node-image/binaries.lock.toml);
- a Debian package the recipe installs for that image (binaries.toml `[debian]`: path ->
  package, with the package file list it was read from);
- a file the render writes for that host, the recipe's overlays, or a node program the host's
  image carries (kilonode.node.ship `programs_for`: none of them travels in custom data);
- with `--images DIR`: the built image's manifest, which wins over the data (a component
  built absent is a break even if it is pinned).

Levels: a program with no delivery path at all is a `break` (an `unpinned` component with no
lock, a Kubernetes version with no pin, a package missing from the recipe's lists, a path
nothing provides). A `lock = true` component whose digest the lock file does not hold yet
(no `--fetch` has recorded it) is a `warn`: "<component> unverified: no digest yet; the first
`--fetch` records it" -- the image can be complete, but its content is not verified until the
lock entry is committed and reviewed.

How a missing program shows depends on what runs it (sources in node-image/binaries.toml and
kilonode.image.needs): a conflist plugin missing on a cri-dockerd pool keeps every node
NotReady (cri-dockerd validates each plugin with libcni's ValidateNetworkList and reports
"cni config uninitialized"); on a containerd pool the node goes Ready and every
non-hostNetwork pod stays in ContainerCreating (containerd 1.7's go-cni only counts the
conflists; the sandbox ADD fails "failed to find plugin"). A missing nested `ipam.type` passes
both runtimes' readiness checks: Ready nodes with no pod networking. The conflist's
`cniVersion` must be one each plugin supports (cri-dockerd runs the plugin's VERSION).
cri-dockerd's minimum Docker Engine API (per release, binaries.toml) must be at most what the
image's docker.io serves, or cri-dockerd refuses to start and the node never registers;
`kilonode image build` refuses such an image too, and refuses an image missing a program
unless `--allow-incomplete`.

With `--images DIR`, every image the program uploads (the plan's boot images: each pool's, etcd's
and the control plane's) must be among the built ones; a graph recorded while a VHD was absent
(its upload keyed `absent`) is a break too: `pulumi up` refuses such a run before it creates
anything.

The images reach Azure as VHD uploads (kilonode.azure.node_image: a `command:local:Command`
per image version), each keyed by its VHD's sha256 when it ran (its first trigger; `not-read`
when the graph was recorded without reading the disks) and its blob. Each must ignore later
changes to its key and path (ignoreChanges): a published version's blob is the disk its
gallery version was copied from, and a kept previous version's is the rollback target; a VHD
rebuilt on the runner's disk (the next build) would otherwise replace it, its delete running
first, under the old version's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from kilonode.image.needs import (
    Catalog,
    ImageSpec,
    Need,
    Provider,
    known_programs,
    load_catalog,
    overlay_paths,
    programs_invoked,
    providers,
    runtime_of,
)
from kilonode.image.recipe import Recipe, load_recipe
from kilonode.paths import shown_lock
from kilonode.preflight.model import Finding, Inputs

NAME = "binaries"
TITLE = "every program a unit, conflist, runtime config or script runs is in the role's image, at a working version"
ROLE_IMAGES = {"etcd": "etcd", "apiserver": "control-plane"}  # host prefix -> the role image it boots


@cache
def _data() -> tuple[Recipe, Catalog]:
    recipe = load_recipe()
    return recipe, load_catalog(recipe)


def _spec(inputs: Inputs, host: str) -> tuple[ImageSpec, str | None, Mapping[str, Any] | None] | None:
    """The image a host boots: its spec, its role image name, its built manifest (--images)."""
    k8s = inputs.plan.kubernetes_version
    manifests = list((inputs.images or {}).values())
    prefix = host.split("-", 1)[0]
    if prefix in ROLE_IMAGES:
        role = ROLE_IMAGES[prefix]
        built = next((m for m in manifests if m.get("role") == role), None)
        return ImageSpec((role,), "control", (), k8s), role, built
    # a pool's host, or one of its teams' (kilonode.render.cluster): the same image
    pool = next((p for p in inputs.plan.node_pools if host in {p.role(), *(p.role(t) for t in p.teams)}), None)
    if pool is None:
        return None
    roles = pool.binary_roles
    built = next((m for m in manifests if m.get("pool") == pool.name), None)
    return ImageSpec(roles, pool.runtime, pool.image_extras, pool.kubernetes_version or k8s), None, built


def _built(manifest: Mapping[str, Any]) -> dict[str, Provider]:
    """What a built image's manifest says about its component files."""
    found: dict[str, Provider] = {}
    for entry in [*manifest.get("binaries", []), *manifest.get("other_binaries", [])]:
        paths = [f["path"] for f in entry.get("files", [])] or [entry["path"]]
        status = "ok" if entry.get("present") else "missing"
        for path in paths:
            found[path] = Provider(status, f"built image {manifest.get('name')}: {entry['name']} {entry.get('origin')}")
    found |= {a["path"]: Provider("ok", f"built image {manifest.get('name')}: {a.get('source')}")
              for a in manifest.get("artefacts", [])}
    return found


def _impact(need: Need, runtime: str | None) -> str:
    """What a missing program does on a running cluster."""
    if need.kind == "cni" and runtime == "docker":
        return ("every node of the pool stays NotReady: cri-dockerd validates each conflist plugin before using the "
                "network (libcni ValidateNetworkList) and reports NetworkReady=false \"cni config uninitialized\"")
    if need.kind == "cni":
        return ("the nodes go Ready, and every non-hostNetwork pod stays in ContainerCreating: containerd does not "
                "check plugins before NetworkReady, and each sandbox ADD fails \"failed to find plugin\"")
    if need.kind == "ipam":
        return ("the nodes go Ready but there is no pod networking: no runtime checks the nested ipam plugin, and "
                f"every pod ADD fails when {need.why.split(chr(39))[0].removeprefix('plugin ')} invokes it")
    if need.kind == "runtime":
        return "every container using that runtime fails to start"
    if need.kind == "script":
        return f"{need.file} fails when it runs it"
    if need.kind == "interpreted":
        return (f"{need.file.rpartition('/')[2]} fails each time it starts: python3 exits 2 (\"can't open file\" "
                "or \"No module named\")")
    return f"{need.file.rpartition('/')[2]} cannot start (status 203/EXEC)"


def _host_findings(inputs: Inputs, host: str) -> list[Finding]:
    found = _spec(inputs, host)
    if found is None:
        return []
    spec, role_image, manifest = found
    recipe, catalog = _data()
    files = inputs.host_files(host)
    runtime = runtime_of(files) if host.startswith("pool-") else None
    have = providers(catalog, recipe, spec)
    have |= {p: Provider("ok", "the render") for p in ("/" + f for f in files)}
    have |= {p: Provider("ok", "the recipe's overlays") for p in overlay_paths(recipe, spec, role_image)}
    if manifest is not None:
        have |= _built(manifest)
    findings: list[Finding] = []
    flagged: set[str] = set()
    for need in programs_invoked(files, known_programs(catalog)):
        options = [have[p] for p in need.paths if p in have]
        if any(o.status == "ok" for o in options):
            findings += _version_findings(catalog, spec, host, need, runtime)
            continue
        unverified = next((o for o in options if o.status == "unverified"), None)
        if unverified is not None:
            if unverified.what not in flagged:
                flagged.add(unverified.what)
                findings.append(Finding(
                    NAME, "warn", host, f"{unverified.what} ({need.path}, {need.why} in {need.file})",
                    f"run `kilonode image build --fetch` once, then commit {shown_lock('binaries.lock.toml')} after "
                    "reviewing the recorded sha256"))
            continue
        reason = options[0].what if options else ("no component, Debian package, node program or rendered file "
                                                  "provides it")
        findings.append(Finding(
            NAME, "break", host,
            f"{need.path} ({need.why} in {need.file}) is not in the image: {reason}. {_impact(need, runtime)}",
            _fix(need)))
    if runtime == "docker" and (problem := catalog.docker_api_problem(spec.kubernetes_version,
                                                                      recipe.package_list(spec.flavour, spec.extras))):
        findings.append(Finding(NAME, "break", host, problem,
                                "pin a compatible cri-dockerd in node-image/binaries.toml, or install a newer Docker"))
    return findings


def _fix(need: Need) -> str:
    if need.kind == "interpreted":
        return ("ship the program into this host's image: its row in kilonode/node/ship.py with this path as its "
                "target and the image among its `images`")
    return ("pin it in node-image/binaries.toml for this role (with its digest), lock it (`lock = true`, then "
            "`kilonode image build --fetch`), add its Debian package to the recipe's lists, or build the image "
            "with it (`--binaries DIR`) and pass `--images`")


def _version_findings(catalog: Catalog, spec: ImageSpec, host: str, need: Need, runtime: str | None) -> list[Finding]:
    """A conflist plugin that is there but does not accept the conflist's cniVersion."""
    if need.kind not in ("cni", "ipam") or not need.cni_version:
        return []
    for role in spec.roles:
        for component in catalog.role(role):
            paths = {f.path for f in component.expanded_files(catalog.arch)}
            if component.cni_versions and set(need.paths) & paths and need.cni_version not in component.cni_versions:
                how = ("every node stays NotReady: cri-dockerd runs each plugin's VERSION and drops a conflist a "
                       "plugin does not support" if runtime == "docker" and need.kind == "cni"
                       else "every pod ADD fails: the plugin refuses the config version")
                accepted = ", ".join(component.cni_versions)
                return [Finding(NAME, "break", host,
                                f"{need.plugin} ({component.name}) accepts CNI spec {accepted}, "
                                f"and {need.file} asks for {need.cni_version}: {how}",
                                "render the conflist with a cniVersion every plugin supports")]
    return []


def check(inputs: Inputs) -> list[Finding]:
    return [*(f for host in inputs.hosts() for f in _host_findings(inputs, host)), *_vhd_uploads(inputs),
            *_images_built(inputs)]


def _images_built(inputs: Inputs) -> list[Finding]:
    """With --images: every image the program uploads (the plan's boot_images) is among them."""
    if inputs.images is None:
        return []
    built = {str(m.get("pool") or m.get("role")) for m in inputs.images.values()}
    return [Finding(
        NAME, "break", f"image {image.name}",
        f"the program uploads the {'role' if image.role else 'pool'} image {image.name}, which the built images "
        "lack: `pulumi up` refuses before it creates anything (kilonode.azure.program.require_vhds)",
        f"build every image the stack boots: `kilonode image build {inputs.plan.cluster} --all --out DIR --fetch`",
    ) for image in inputs.plan.boot_images if image.name not in built]


COMMAND = "command:local:Command"
VHD_UPLOAD = re.compile(r"\baz storage blob upload\b.*--type page")
VHD_KEY = re.compile(r"^(sha256:[0-9a-f]{64}|not-read|absent)$")


def _vhd_uploads(inputs: Inputs) -> list[Finding]:
    """Every VHD upload is keyed by its VHD's digest (the module docstring says why)."""
    findings = []
    for upload in inputs.of_type(COMMAND):
        if not VHD_UPLOAD.search(str(upload.inputs.get("create", ""))):
            continue
        triggers = [str(t) for t in upload.inputs.get("triggers") or []]
        if "absent" in triggers:
            findings.append(Finding(
                NAME, "break", upload.describe(),
                f"its VHD {(upload.inputs.get('environment') or {}).get('VHD', '')} was not built when the program "
                "read it: `pulumi up` refuses before it creates anything",
                f"`kilonode image build {inputs.plan.cluster} --all --out build/node-image --fetch`",
            ))
        elif not any(VHD_KEY.match(t) for t in triggers):
            findings.append(Finding(
                NAME, "break", upload.describe(),
                f"the upload is keyed by {triggers or 'nothing'}, not by the VHD's sha256: what it uploaded is not "
                "recorded, and an absent VHD is not caught before `pulumi up` starts",
                "key the upload on kilonode.azure.node_image.vhd_digest (its first trigger)",
            ))
        elif not {"triggers", "environment"} <= set(upload.ignore_changes):
            findings.append(Finding(
                NAME, "break", upload.describe(),
                "the upload runs again when the VHD on disk changes: the next build's VHD would replace this "
                "version's blob (its delete first), the disk its gallery version was made from or the rollback "
                "target, under the old version's name",
                "give the upload ignoreChanges on triggers and environment (kilonode.azure.node_image._upload_vhd)",
            ))
    return findings
