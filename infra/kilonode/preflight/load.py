"""Reading preflight's inputs: a `kilonode render` directory, a `kilonode plan --format json`
file and a folder of built images, or the same artefacts in memory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kilonode.image.manifest import FORMAT as IMAGE_MANIFEST_FORMAT
from kilonode.plan.model import ClusterPlan
from kilonode.preflight.model import InputError, Inputs, Resource
from kilonode.yamlio import load_yaml

PLAN_FILE = "plan.yaml"  # what `kilonode render` writes at the top of its directory
MARKER = ".kilonode-render.json"
# what `kilonode image build` writes beside each image (kilonode.image.manifest.manifest_path)
IMAGE_MANIFEST_SUFFIX = ".manifest.json"


def plan_from_yaml(text: str, where: str) -> ClusterPlan:
    try:
        return ClusterPlan.model_validate(load_yaml(text))
    except (yaml.YAMLError, ValidationError) as error:
        raise InputError(f"{where}: not a kilonode plan ({str(error).splitlines()[0]}); "
                         "render the stack again with this kilonode (`kilonode render STACK --out DIR`)") from None


def resources_from_json(data: Any, where: str) -> tuple[Resource, ...]:
    """The resources of a recorded graph as `kilonode plan --format json` writes it."""
    if not isinstance(data, dict) or not isinstance(data.get("resources"), list):
        raise InputError(f"{where}: no 'resources' list; give the output of `kilonode plan STACK --format json`")
    found = []
    for index, item in enumerate(data["resources"]):
        if not isinstance(item, dict) or not {"type", "name"} <= item.keys():
            raise InputError(f"{where}: resources[{index}] has no type and name")
        found.append(Resource(item["type"], item["name"], item.get("parent"), item.get("inputs") or {},
                              item.get("customTimeouts") or {}, tuple(item.get("ignoreChanges") or ())))
    return tuple(found)


def outputs_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded graph's stack outputs; none in a graph recorded before they were kept."""
    outputs = data.get("outputs")
    return dict(outputs) if isinstance(outputs, dict) else {}


def images_from_dir(directory: Path) -> dict[str, Mapping[str, Any]]:
    """Every built image's manifest in `directory` or its folders (`kilonode image build --out`
    writes <image>.manifest.json beside the image), by image name."""
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory of built images (--images)")
    manifests = sorted({*directory.glob(f"*{IMAGE_MANIFEST_SUFFIX}"), *directory.glob(f"*/*{IMAGE_MANIFEST_SUFFIX}")})
    if not manifests:
        raise InputError(f"{directory}: no *{IMAGE_MANIFEST_SUFFIX} in it or its folders; give the --out folder(s) "
                         "of `kilonode image build`")
    found: dict[str, Mapping[str, Any]] = {}
    for path in manifests:
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise InputError(f"{path}: not readable as JSON ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != IMAGE_MANIFEST_FORMAT or "name" not in manifest:
            raise InputError(f"{path}: not a kilonode image manifest (format {IMAGE_MANIFEST_FORMAT}); build the "
                             "image again with this kilonode")
        found[str(manifest["name"])] = manifest
    return found


def from_directories(render: Path, graph: Path, images: Path | None = None) -> Inputs:
    """Inputs from artefacts on disk, as CI keeps them."""
    if not (render / PLAN_FILE).is_file():
        raise InputError(f"{render}: no {PLAN_FILE}; give a directory `kilonode render STACK --out DIR` wrote")
    files = {
        path.relative_to(render).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(render.rglob("*"))
        if path.is_file() and path.name != MARKER and path.parent != render
    }
    try:
        data = json.loads(graph.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{graph}: not readable as JSON ({error}); give `kilonode plan STACK --format json`'s "
                         "output") from None
    return Inputs(
        plan=plan_from_yaml((render / PLAN_FILE).read_text(encoding="utf-8"), str(render / PLAN_FILE)),
        files=files,
        resources=resources_from_json(data, str(graph)),
        outputs=outputs_from_json(data),
        images=images_from_dir(images) if images else None,
        source=f"{render} + {graph}",
    )


def from_parts(plan: ClusterPlan, files: Mapping[str, str], graph: Mapping[str, Any],
               images: Mapping[str, Mapping[str, Any]] | None = None, source: str = "") -> Inputs:
    """Inputs from artefacts in memory: a render tree ("<host>/<path>" -> text, the top-level
    config.yaml and plan.yaml left out or kept) and a graph's JSON form."""
    return Inputs(plan=plan, files={k: v for k, v in files.items() if "/" in k},
                  resources=resources_from_json(graph, source or "the recorded graph"),
                  outputs=outputs_from_json(graph), images=images, source=source)
