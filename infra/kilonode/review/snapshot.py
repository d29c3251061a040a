"""One side of a review: what a checkout of kilonode renders and records for its stacks.

Run as a script by `kilonode diff`, once per git ref, with that ref's own `kilonode` package
first on PYTHONPATH, so the base is rendered by the base's code and the head by the head's
(a change to the toolkit shows as what it changes in every stack). It therefore imports only
long-standing entry points of the package (load_stack, plan_stack, render_tree, run_plan,
format_manifests) and nothing from kilonode.review.

    python snapshot.py --out base.json --stack research-7500

writes, per stack, the files `kilonode render` writes (custom data included: a role's
user-data is part 1 of its Azure custom data), the in-cluster objects as YAML, and the
recorded resource graph with every secret replaced by `[secret sha256:<12 hex>]`: a digest of
the mock engine's value, so a changed secret input (custom data carrying a new certificate)
shows as changed without showing it. A stack that does not load at this ref records its
problems instead.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from pathlib import Path
from typing import Any

from kilonode.digest import sha256_text
from kilonode.yamlio import load_yaml

FORMAT = 2  # 2: customTimeouts recorded
SECRET = "[secret]"
# Where a snapshot holds the stack file's config keys outside `kilonode:cluster`
# (kilonode.config.load.PROVIDER_KEYS): a change to one shows as a change to this file.
PROVIDER_CONFIG = "pulumi-config.yaml"


def _digest(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"[secret sha256:{sha256_text(text)[:12]}]"


def _with_digests(masked: Any, plain: Any) -> Any:
    """`masked` with each `[secret]` replaced by the digest of the value at the same place in
    `plain` (masking replaces whole values, so the two trees align down to each mask)."""
    if masked == SECRET:
        return _digest(plain)
    if isinstance(masked, dict) and isinstance(plain, dict):
        return {k: _with_digests(v, plain.get(k)) for k, v in masked.items()}
    if isinstance(masked, list) and isinstance(plain, list) and len(masked) == len(plain):
        return [_with_digests(m, p) for m, p in zip(masked, plain, strict=True)]
    return masked


def _stack(name: str) -> dict[str, Any]:
    from kilonode import plan as planning
    from kilonode.azure.mockplan import run_plan
    from kilonode.config import load_stack
    from kilonode.problems import StackError
    from kilonode.render.cluster import render_tree

    # checked_plan: what every command plans a stack file with; an older ref has plan_stack only
    plan_with = getattr(planning, "checked_plan", planning.plan_stack)
    try:
        stack = load_stack(name)
        plan = plan_with(stack)
    except StackError as error:
        return {"error": str(error)}
    files = {path: file.content for path, file in render_tree(stack.config, plan).items()}
    # the config keys outside kilonode's that `pulumi up` hands a provider (an older ref has none)
    provider = getattr(stack, "provider_config", None)
    if provider:
        files[PROVIDER_CONFIG] = "".join(f"{key}: {json.dumps(value)}\n" for key, value in sorted(provider.items()))
    try:
        graph = run_plan(stack)
    except Exception as error:  # the program refused it (a guard, a check): say so, as Pulumi would
        return {"error": f"the Pulumi program stopped: {type(error).__name__}: {error}", "files": files}
    return entry(plan, files, graph)


def entry(plan: Any, files: dict[str, str], graph: Any) -> dict[str, Any]:
    """One stack's snapshot from its plan, its rendered tree (`render_tree`: path -> text) and
    its recorded graph (the tests build the same from their cached plans and graphs)."""
    from kilonode.azure.graph import format_manifests

    files = files | format_manifests(graph)
    resources = []
    for r in graph.resources:
        resources.append({
            "type": r.type, "name": r.name, "parent": r.parent, "protect": r.protect, "custom": r.custom,
            "deleteBeforeReplace": r.delete_before_replace,
            "replaceOnChanges": list(r.replace_on_changes), "ignoreChanges": list(r.ignore_changes),
            # preflight's checks read it (an await's timeout): the review runs them on each side
            **({"customTimeouts": dict(r.custom_timeouts)} if r.custom_timeouts else {}),
            "inputs": _with_digests(r.masked(), r.plain()),
        })
    outputs = graph.to_json()["outputs"]
    return {"files": dict(sorted(files.items())), "resources": resources, "outputs": outputs,
            "imageContents": _image_contents(plan)}


def _image_contents(plan: Any) -> dict[str, Any]:
    """What each machine image this stack boots would carry if built at this ref: its version
    (the stack's), the pinned binaries at their versions (node-image/binaries.toml for the
    stack's Kubernetes version), the container images baked in for preloading, and the recipe's
    pins (`_recipe`: every package at its declared version, the kernel, the files copied in, the
    locks). A review compares them where the version did not move (a built image never changes
    under its version) and names them where it did (what the fleet rolls out)."""
    from kilonode.catalog.binaries import load

    try:
        catalog = load()
    except Exception as error:  # an unreadable catalogue is the build's error to report, not the review's
        return {"error": str(error)}

    def binaries(roles: list[str], version: str = plan.kubernetes_version) -> dict[str, str] | str:
        try:
            return {r.name: r.version for role in roles for r in catalog.resolve(role, version)}
        except Exception as error:
            return str(error)

    found: dict[str, Any] = {
        "control-plane": {"version": plan.control_plane_image_version, "binaries": binaries(["control-plane"]),
                          "preload": [], "recipe": _recipe("control", (), "control-plane")},
        "etcd": {"version": plan.etcd_image_version, "binaries": binaries(["etcd"]), "preload": [],
                 "recipe": _recipe("control", (), "etcd")},
    }
    for pool in plan.node_pools:
        found[pool.role()] = {
            "version": plan.image_version_of(pool.name),
            "binaries": binaries(list(pool.binary_roles), pool.kubernetes_version or plan.kubernetes_version),
            "preload": sorted(item.image for item in pool.preload_images),
            "recipe": _recipe(pool.runtime, tuple(getattr(pool, "image_extras", ())), None),
        }
    return found


def _baked_programs(role: str | None, extras: tuple[str, ...]) -> dict[str, Path]:
    """The kilonode node programs the build writes into this image (kilonode.node.ship programs_for:
    the GPU health agent and its thresholds on a GPU pool's), by their path in the toolkit: a change
    to one reaches machines only with a new image version, like any file the build copies in, while
    what reads the same source at `pulumi up` (the alert rules built from the agent's thresholds)
    changes at once."""
    import kilonode.node
    from kilonode.node.ship import programs_for

    root = Path(kilonode.node.__file__).parent
    found: dict[str, Path] = {}
    for program in programs_for(role, extras):
        source = root / program.source
        paths = sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if source.is_dir() else [source]
        found |= {f"infra/kilonode/node/{p.relative_to(root).as_posix()}": p for p in paths if p.is_file()}
    return found


def _recipe(flavour: str, extras: tuple[str, ...], role: str | None) -> dict[str, Any] | str:
    """The node-image recipe's pins for one image (kilonode.image.recipe): each package the image
    is built with at the version the recipe declares ("" where apt picks), the kernel it boots,
    the packages that must be one driver release (driver, Fabric Manager, NSCQ), the sha256 (12
    hex) of each file the build copies in (the common, role and extras overlays, the pause source,
    the DKMS patches) and of the two lock files. Read from this ref's node-image/."""
    from kilonode.digest import sha256_file
    from kilonode.paths import node_image_lock

    try:
        recipe = _load_recipe()
        declared = recipe.declared_packages(flavour, extras)  # type: ignore[arg-type]
        dirs = [recipe.overlay_dir, *(recipe.extra_overlay_dir(e) for e in extras)]  # type: ignore[arg-type]
        if role:
            dirs.append(recipe.role_overlay_dir(role))
        files = {recipe.shown(p): p for d in dirs if d.is_dir() for p in sorted(d.rglob("*")) if p.is_file()}
        files[recipe.shown(recipe.pause_source)] = recipe.pause_source
        files |= {recipe.shown(p): p for ps in recipe.dkms_patches(extras).values() for p in ps}  # type: ignore[arg-type]
        # the locks by their name in node-image/: in a user's project they are its own files
        # (kilonode.paths.node_image_lock), whose absolute path differs between the refs' copies
        for lock in (recipe.apt_lock_file, node_image_lock("binaries.lock.toml", recipe.root)):
            if lock.is_file():
                files[f"node-image/{lock.name}"] = lock
        files |= _baked_programs(role, extras)
        equal = {role_: package for e in extras for role_, package in recipe.extras[e].equal_versions.items()}
        return {"packages": {name: d.version or "" for name, d in sorted(declared.items())},
                "kernel": recipe.kernel_for(extras).image,  # type: ignore[arg-type]
                "equalVersions": equal,
                "files": {name: sha256_file(path)[:12] for name, path in sorted(files.items())}}
    except Exception as error:  # a recipe this ref cannot read: its build says why; the review shows it
        return f"{type(error).__name__}: {error}"


@functools.cache
def _load_recipe() -> Any:
    from kilonode.image.recipe import load_recipe

    return load_recipe()


def _lessons() -> dict[str, Any]:
    """The field values the toolkit ships, for rules that say a value was made weaker."""

    from kilonode.paths import SYSCTL_DIR

    sysctl: dict[str, Any] = {}
    for profile in sorted(Path(SYSCTL_DIR).glob("*.yaml")):
        for key, entry in (load_yaml(profile.read_text()) or {}).items():
            if isinstance(entry, dict) and "value" in entry:
                sysctl[key] = entry["value"]
    return {"sysctl": sysctl}


def take(stacks: list[str]) -> dict[str, Any]:
    from kilonode.config import available_stacks

    return {"format": FORMAT, "available": available_stacks(), "stacks": {name: _stack(name) for name in stacks},
            "lessons": _lessons()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stack", action="append", default=[], help="a shipped stack's name (repeatable)")
    args = parser.parse_args(argv)
    snapshot = take(args.stack)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(snapshot, sort_keys=True), encoding="utf-8")
    partial.replace(args.out)
    return 0


if __name__ == "__main__":
    # The process is one short run that builds a large heap (Pulumi's SDKs and the program:
    # ~1M objects) and exits: the cyclic collector's passes over it took ~45% of a
    # research-7500 snapshot's CPU and returned ~10 MB per stack, which the exit returns
    # anyway. Reference counting frees the rest as before; the output is the same byte for byte.
    # The interpreter's last collection at exit walks that heap once more (gc.disable does not
    # stop it): frozen, it is out of its reach (kilonode.entry does the same for `plan`; this
    # script imports nothing a base ref's package may lack).
    gc.disable()
    code = main()
    gc.freeze()
    sys.exit(code)
