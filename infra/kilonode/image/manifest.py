"""The build manifest: what is in an image and what it was built from.

Written beside the image as <name>.manifest.json. `verify` reads it to know the pool's plan,
the artefacts' sha256 and the preloaded images' IDs: the checks are driven by the same data
the image was built from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilonode.plan.model import NodePoolPlan

FORMAT = 1


def manifest_path(image: Path) -> Path:
    """local-cpu.raw / local-cpu.vhd -> local-cpu.manifest.json"""
    return image.with_name(image.name.rsplit(".", 1)[0] + ".manifest.json")


@dataclass(frozen=True)
class Manifest:
    data: dict[str, Any]
    path: Path

    @classmethod
    def load(cls, path: Path) -> Manifest:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: manifest format {data.get('format')!r}, expected {FORMAT}")
        return cls(data, path)

    @classmethod
    def for_image(cls, image: Path) -> Manifest:
        path = manifest_path(image)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: `kilonode image build` writes it beside the image")
        return cls.load(path)

    @property
    def pool(self) -> NodePoolPlan:
        return NodePoolPlan.model_validate(self.data["pool_plan"])

    @property
    def user_data_path(self) -> Path:
        return self.path.parent / self.data["user_data"]["file"]

    @property
    def artefacts(self) -> list[dict[str, Any]]:
        return list(self.data["artefacts"])

    @property
    def preloaded_images(self) -> list[dict[str, Any]]:
        return list(self.data["preloaded_images"])

    @property
    def binaries(self) -> list[dict[str, Any]]:
        return list(self.data["binaries"])

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=False) + "\n")
        tmp.replace(self.path)
