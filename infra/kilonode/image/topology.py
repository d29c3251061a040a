"""A pool size's NCCL topology file as node-image/binaries.toml pins it (`nccl-topology-<family>`),
found where the image build would take it and verified against the pin: for a job that carries
the file itself (`kilonode gpu nccl-job`, docs/nccl-job.md) instead of mounting the node's copy.

Searched as the image build searches: a directory given with --binaries (the file by the name
it is installed under, `topo.xml`, as `kilonode image build --binaries` takes it; or by the
download's own name, `<family>-topo.xml`), else the verified downloads `kilonode image build
--fetch` keeps (kilonode.image.binaries.download_cache). The file is Azure/azhpc-images'; this
repository pins its digest and never carries its content.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kilonode.catalog.binaries import Catalog, PinError, Resolved
from kilonode.catalog.binaries import load as load_catalog
from kilonode.digest import sha256_file
from kilonode.image.binaries import download_cache, download_name
from kilonode.plan import wellknown


class TopologyUnavailable(Exception):
    """The pinned file is not where it was looked for, or a file there is not it: the message
    says where it looked and both ways to supply it."""


@dataclass(frozen=True)
class PinnedTopology:
    component: str  # nccl-topology-<family>
    sha256: str
    url: str
    names: tuple[str, ...]  # the file names looked for in a --binaries directory, in order


@dataclass(frozen=True)
class TopologyFile:
    pinned: PinnedTopology
    content: str
    origin: Path


def _resolved(family: str, catalog: Catalog) -> Resolved:
    name = wellknown.nccl_topology_component(family)
    if name not in catalog.components:
        raise TopologyUnavailable(f"node-image/binaries.toml pins no {name}")
    try:
        item = catalog.resolve_component(catalog.components[name], "")
    except PinError as error:
        raise TopologyUnavailable(str(error)) from error
    if item.pin.algorithm != "sha256" or len(item.files) != 1:
        raise TopologyUnavailable(f"{name}: expected one file pinned by sha256 in node-image/binaries.toml")
    return item


def pinned(family: str, catalog: Catalog | None = None) -> PinnedTopology:
    """The pin of the family's topology file: its component, sha256, URL and given names."""
    item = _resolved(family, catalog or load_catalog())
    installed = PurePosixPath(item.files[0].path).name
    downloaded = PurePosixPath(item.url).name
    names = tuple(dict.fromkeys((installed, downloaded)))
    return PinnedTopology(item.name, item.pin.digest, item.url, names)


def find(family: str, binaries_dir: Path | None, *, catalog: Catalog | None = None,
         cache_dir: Path | None = None) -> TopologyFile:
    """The pinned file's text, from `binaries_dir` if given, else the --fetch downloads.
    Raises TopologyUnavailable when it is in neither, or a file found is not the pinned one
    (a wrong file is refused, never taken as given: the job would hand NCCL a wrong topology)."""
    catalog = catalog or load_catalog()
    item = _resolved(family, catalog)
    pin = pinned(family, catalog)
    candidates = [binaries_dir / name for name in pin.names] if binaries_dir is not None else []
    candidates.append((cache_dir or download_cache()) / download_name(item))
    for path in candidates:
        if not path.is_file():
            continue
        got = sha256_file(path)
        if got != pin.sha256:
            raise TopologyUnavailable(f"{path} is not the pinned {pin.component}: sha256 {got}, "
                                      f"node-image/binaries.toml pins {pin.sha256}. {how_to_supply(pin)}")
        # bytes decoded as they are: read_text would translate line endings, and the digest
        # is of the bytes
        return TopologyFile(pin, path.read_bytes().decode("utf-8"), path)
    looked = ", ".join(str(p) for p in candidates)
    raise TopologyUnavailable(f"{pin.component} (sha256 {pin.sha256}) not found; looked for {looked}. "
                              f"{how_to_supply(pin)}")


def how_to_supply(pin: PinnedTopology) -> str:
    names = " or ".join(f"`{n}`" for n in pin.names)
    return (f"Supply it with --binaries DIR holding {names} (downloaded from {pin.url}), or build the pool's "
            f"image once with `kilonode image build --fetch`, which keeps the verified download in "
            f"{download_cache()}")
