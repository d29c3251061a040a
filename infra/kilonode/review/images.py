"""What the machine images carry, on each side of a change: every pin the image build uses (each
package at its declared version, the kernel, the files the build copies in, the lock files:
kilonode.review.snapshot records them per image from that ref's node-image/ recipe), beside the
binaries and preloaded images kilonode.review.versions compares.

- A change to them under an image version that does not move reaches no machine: a gallery
  image version is a copy Azure makes once (kilonode.azure.node_image), so the machines keep
  the image built as that version, and a rebuild under it would be a second, different image
  with the same name. Medium (`image-recipe-unreleased`): bump the version to ship it.
- Under a version that moves, it is what the fleet rolls out: kilonode.review.risks' fleet rule
  names it beside the rollout (`changes`).
- The driver, Fabric Manager and NSCQ must be one driver release: the head's GPU images are
  judged by the same function the image build refuses an image with and preflight's
  gpu-runtime check reports (kilonode.image.vendor_apt.version_problems). A new mismatch is high
  (`gpu-driver-mismatch`): Fabric Manager refuses to start, and NSCQ to load, against another
  driver, and on an NVSwitch size CUDA cannot initialise without Fabric Manager
  (cudaErrorSystemNotReady, 802), so every GPU job of those pools fails.

Pure: a StackDiff in, findings and lines out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.image import vendor_apt
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

APT_CHOICE = "(apt's choice)"
RECIPE = "the node-image recipe"  # the decision the recipe's findings share (the report's one line)


def _contents(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    found = (entry or {}).get("imageContents")
    return dict(found) if isinstance(found, Mapping) and "error" not in found else {}


def _recipe(image: Any) -> Mapping[str, Any] | None:
    recipe = image.get("recipe") if isinstance(image, Mapping) else None
    return recipe if isinstance(recipe, Mapping) else None


def _pin(version: Any) -> str:
    return str(version) if version else APT_CHOICE


def recipe_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """One line per pin that differs between two images' recipes."""
    found = []
    was, now = base.get("packages") or {}, head.get("packages") or {}
    for name in sorted(was.keys() | now.keys()):
        if name not in now:
            found.append(f"package {name} removed")
        elif name not in was:
            found.append(f"package {name} added at {_pin(now[name])}")
        elif was[name] != now[name]:
            found.append(f"{name} {_pin(was[name])} -> {_pin(now[name])}")
    if base.get("kernel") != head.get("kernel"):
        found.append(f"kernel {base.get('kernel')} -> {head.get('kernel')}")
    old_files, new_files = base.get("files") or {}, head.get("files") or {}
    files = sorted(f for f in old_files.keys() | new_files.keys() if old_files.get(f) != new_files.get(f))
    if files:
        found.append(f"file(s) the build copies in: {', '.join(files)}")
    return found


def changes(diff: StackDiff) -> dict[str, tuple[str, str, list[str]]]:
    """image key (control-plane, etcd, pool-<name>) -> (version before, after, what its recipe
    changes), for every image whose version or recipe differs."""
    base, head = _contents(diff.base), _contents(diff.head)
    kept = plan_of(diff.base).get("imagePrevious") or {}
    found = {}
    for key, image in head.items():
        was, now = _recipe(base.get(key)), _recipe(image)
        if was is None or now is None or (was == now and base[key].get("version") == image.get("version")):
            continue
        version = str(image.get("version"))
        if version != str(base[key].get("version")) and version == str(kept.get(key.removeprefix("pool-"), "")):
            # back to the version the base kept published: its machines boot what that version was built
            # from, not today's recipe (which both sides render), so today's contents say nothing of it
            found[key] = (str(base[key].get("version")), version, [ROLLBACK.format(version=version)])
            continue
        found[key] = (str(base[key].get("version")), version,
                      recipe_changes(was, now) + binary_changes(base[key], image))
    return found


# A rollback's contents: the image version the base kept as `previous`, built before, from its own recipe
# and binaries; a pool rolled back to it runs the kubelet that image carries, so its kubernetesVersion
# goes back in the same change (docs/operations.md, "Rolling a node image", step 6).
ROLLBACK = ("a rollback to {version}, the version kept as previous: its machines get what {version} was built "
            "from (its own recipe and binaries, which the review cannot read: both sides render today's), so set "
            "the pool's kubernetesVersion, or the stack's, back to what it carries in the same change")


def binary_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """One line per pinned upstream binary whose version differs (a pool's kubelet moving with its
    nodePools[].kubernetesVersion, the control plane's kubernetes-server with kubernetesVersion)."""
    was, now = base.get("binaries"), head.get("binaries")
    if not isinstance(was, Mapping) or not isinstance(now, Mapping):
        return []
    return [f"{name} {was.get(name, 'absent')} -> {now.get(name, 'absent')}"
            for name in sorted(was.keys() | now.keys()) if was.get(name) != now.get(name)]


# An image whose version moves with a recipe, binaries and files all as before (a CPU pool's image when
# only the GPU pins move: the NVIDIA packages are in the GPU pools' recipes alone, kilonode.image.gpu):
# rebuilt and rolled for nothing.
UNCHANGED = ("contents unchanged: a new version of the same recipe, rolled for nothing; nodeImage.pools can keep "
             "this pool at its version so only the pools whose contents change roll")


def describe(diff: StackDiff) -> list[str]:
    """The report's lines about the images (one per distinct change, with its images)."""
    grouped: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for key, (was, now, lines) in changes(diff).items():
        grouped.setdefault((was, now, tuple(lines)), []).append(key)
    return [f"image {', '.join(keys)} ({was}" + (f" -> {now}" if now != was else ", version unchanged") + "): "
            + ("; ".join(lines) or UNCHANGED) for (was, now, lines), keys in grouped.items()]


def _label(key: str) -> str:
    return {"control-plane": "controlPlaneImageVersion", "etcd": "etcdImageVersion"}.get(key, "nodeImageVersion")


def assess(diff: StackDiff) -> list[Finding]:
    return [*_unreleased(diff), *_driver_release(diff)]


def _unreleased(diff: StackDiff) -> list[Finding]:
    grouped: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for key, (was, now, lines) in changes(diff).items():
        if was == now and lines:
            grouped.setdefault((_label(key), now, tuple(lines)), []).append(key)
    return [Finding(MEDIUM, "image-recipe-unreleased", (
        f"{', '.join(keys)}: the recipe changes what the image carries ({'; '.join(lines)}) but {label} stays "
        f"{version}: no machine gets it. A gallery image version is a copy Azure makes once, so the machines keep "
        f"the image built as {version}, and a rebuild under it would be a second, different image with the same "
        f"name. Bump {label}, build and upload the image (`kilonode image build`), then roll"), tuple(keys),
        cause=RECIPE)
        for (label, version, lines), keys in grouped.items()]


def _one_release(image: Any) -> list[str]:
    recipe = _recipe(image) or {}
    equal, packages = recipe.get("equalVersions") or {}, recipe.get("packages") or {}
    installed = {p: str(v) for p, v in packages.items() if v}
    return vendor_apt.version_problems(installed, dict(equal)) if equal else []


def _driver_release(diff: StackDiff) -> list[Finding]:
    base, head = _contents(diff.base), _contents(diff.head)
    pools = {f"pool-{p.get('name')}": p for p in plan_of(diff.head).get("nodePools") or [] if isinstance(p, Mapping)}
    grouped: dict[tuple[str, ...], list[str]] = {}
    for key, image in head.items():
        new = [p for p in _one_release(image) if p not in _one_release(base.get(key))]
        if new:
            grouped.setdefault(tuple(new), []).append(key)
    found = []
    for problems, keys in grouped.items():
        switched = [f"{k} ({int(pools[k].get('nodes') or 0):,} nodes, {pools[k].get('vmSize')})" for k in keys
                    if pools.get(k, {}).get("nvswitch")]
        where = (f"on the NVSwitch pools {', '.join(switched)} CUDA cannot initialise without it "
                 "(cudaErrorSystemNotReady, 802): every GPU job there fails" if switched else
                 "these pools' sizes have no NVSwitch, so CUDA runs, but the build still refuses the image")
        found.append(Finding(HIGH, "gpu-driver-mismatch", (
            f"{', '.join(keys)}: the node image's GPU packages are not one driver release: {'; '.join(problems)}. "
            "`kilonode image build` refuses such an image (kilonode.image.vendor_apt.version_problems, the rule "
            "preflight's gpu-runtime check applies); built any other way, Fabric Manager refuses to start and "
            f"{where}. "
            "Move the driver (node-image/packages/gpu.txt), Fabric Manager and NSCQ (node-image/recipe.toml "
            "[apt_repositories.*.packages]) together"), tuple(keys), cause=RECIPE))
    return found
