"""Container image archives made without a registry or a container engine.

One tar serves both runtimes (measured on these machines): Docker 20.10's
`docker load` reads the docker-archive metadata (`manifest.json`) and refuses a pure OCI
layout; `ctr -n k8s.io images import` reads the OCI metadata (`index.json`). Both point at
the same blobs, so the layer is stored once. Everything is deterministic: fixed mtimes,
owners and ordering, so the same binary gives the same archive and the same image ID.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from kilonode.digest import sha256_bytes

# 2000-01-01: any fixed time; archives must not change when nothing in them did.
EPOCH = 946684800


@dataclass(frozen=True)
class ImageArchive:
    image: str
    path: Path
    sha256: str  # of the archive file
    image_id: str  # "sha256:<config digest>": what `docker image inspect` reports as Id


def compile_pause(source: Path, out: Path) -> Path:
    """gcc -static: the image holds nothing but this binary, so it must need no libc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found: the pause image is compiled at build time (apt-get install gcc libc6-dev)")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [gcc, "-static", "-Os", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"compiling {source} failed:\n{result.stderr}")
    subprocess.run(["strip", str(out)], check=False, capture_output=True)
    return out


def _tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()




def single_binary_image(image: str, binary: Path, entrypoint: str, out: Path) -> ImageArchive:
    """Write `out`: an image whose only layer holds `binary` at `entrypoint`."""
    layer = _tar_bytes([(entrypoint.lstrip("/"), binary.read_bytes(), 0o755)])
    layer_digest = sha256_bytes(layer)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "2000-01-01T00:00:00Z",
            "config": {"Entrypoint": [entrypoint], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [{"created": "2000-01-01T00:00:00Z", "created_by": "kilonode node-image recipe"}],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    config_digest = sha256_bytes(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{config_digest}",
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}",
                    "size": len(layer),
                }
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    manifest_digest = sha256_bytes(manifest)
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{manifest_digest}",
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": image,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    docker_manifest = json.dumps(
        [
            {
                "Config": f"blobs/sha256/{config_digest}",
                "RepoTags": [image],
                "Layers": [f"blobs/sha256/{layer_digest}"],
            }
        ],
        separators=(",", ":"),
    ).encode()
    archive = _tar_bytes(
        [
            ("blobs/sha256/" + layer_digest, layer, 0o644),
            ("blobs/sha256/" + config_digest, config, 0o644),
            ("blobs/sha256/" + manifest_digest, manifest, 0o644),
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
            ("index.json", index, 0o644),
            ("manifest.json", docker_manifest, 0o644),
        ]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(archive)
    return ImageArchive(image=image, path=out, sha256=sha256_bytes(archive), image_id=f"sha256:{config_digest}")


def describe_archive(image: str, path: Path) -> ImageArchive:
    """A user-supplied archive: check it is a docker-archive holding `image` and nothing else;
    find its ID. `docker load` loads every entry of manifest.json and takes every RepoTag in it
    over, whatever image holds it now (moby v20.10.24 image/tarexport/load.go: each manifest
    entry, setLoadedTag with force), and computes the ID from the config's bytes, not from its
    file name (image/fs.go: digest.FromBytes): so one entry, one tag, and the ID is the config's
    own sha256, checked against its name (independent trace of issue 37, round 5, finding 1: an
    archive whose config was renamed, or that carried calico-node's tag beside its own, passed)."""
    with tarfile.open(path) as tar:
        try:
            member = tar.extractfile("manifest.json")
        except KeyError:
            member = None
        if member is None:
            raise ValueError(
                f"{path}: no manifest.json; Docker 20.10 loads only docker-archive tarballs "
                "(`docker save -o FILE IMAGE` makes one)"
            )
        entries = json.load(member)
        tags = [tag for entry in entries for tag in entry.get("RepoTags") or []]
        if tags != [image] or len(entries) != 1:
            raise ValueError(f"{path}: holds {tags or 'no tagged image'} in {len(entries)} image(s); it must hold "
                             f"{image} alone (`docker load` takes every tag an archive carries)")
        config = str(entries[0]["Config"])
        try:
            blob = tar.extractfile(config)
        except KeyError:
            blob = None
        if blob is None:
            raise ValueError(f"{path}: its manifest names config {config}, which the archive does not hold")
        digest = sha256_bytes(blob.read())
    named = config.rsplit("/", 1)[-1].removesuffix(".json")
    if named != digest:
        raise ValueError(f"{path}: config {config} holds sha256:{digest}, not the ID its name says: the image "
                         "`docker load` would make is another")
    return ImageArchive(image=image, path=path, sha256=sha256_bytes(path.read_bytes()), image_id=f"sha256:{digest}")
