"""`kilonode image build|verify`: the node image, built offline and verified on a booted VM."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import die, err, load_and_plan, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.config import Stack
    from kilonode.image.build import BuildResult, ImageInputs
    from kilonode.plan import ClusterPlan

image_app = typer.Typer(
    name="image",
    help=(
        "Build a node pool's disk image (GPT + UEFI, raw and fixed VHD, manifest) from Debian packages "
        "and the pool's rendered artefacts, and verify it: boot it in qemu with the pool's cloud-init "
        "user-data as a NoCloud seed and a blank local SSD, run the testinfra suite, reboot, run the "
        "persistence checks again. The etcd members and the apiservers boot images built the same way "
        "(--role etcd, --role control-plane)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def image_inputs(stack_ref: str, pool_name: str | None, role: str | None = None) -> ImageInputs:
    """Load, validate, plan and render the stack (exit 2 on its problems); the inputs of the
    pool's image, or of the role's (etcd, control-plane)."""
    stack, plan = load_and_plan(stack_ref)
    return _inputs(stack, plan, pool_name, role)


def _inputs(stack: Stack, plan: ClusterPlan, pool_name: str | None, role: str | None) -> ImageInputs:
    from kilonode.config.load import project_root
    from kilonode.image.build import ImageInputs, find_pool, role_inputs
    from kilonode.render import render_cluster

    project_dir = project_root(stack.file.parent) or stack.file.parent
    if role is not None:
        return role_inputs(stack, plan, role, project_dir)
    pool = find_pool(plan, str(pool_name))
    return ImageInputs(
        stack=stack, plan=plan, pool=pool, files=render_cluster(plan)[pool.role()],
        project_dir=project_dir,
    )


class _Progress:
    """Steps in progress show as a spinner (on a terminal); finished steps as timed lines."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.status = out.status("")

    def __call__(self, line: str) -> None:
        if line.endswith(" ..."):
            self.status.update(f"{line} [dim]({time.monotonic() - self.start:.0f}s)[/]")
            self.status.start()
            return
        self.status.stop()
        out.print(f"[dim]{time.monotonic() - self.start:6.1f}s[/] {line}")

    def close(self) -> None:
        self.status.stop()


@image_app.command()
def build(
    stack: Annotated[str, typer.Argument(metavar="STACK", help="A stack name in stacks/ or a path to a stack file.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for <stack>-<pool>.raw/.vhd/.manifest.json.")],
    pool: Annotated[str | None, typer.Option("--pool", help="The node pool whose image to build.")] = None,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Build every image the stack's machines boot, one after the other: each pool's, then etcd's and "
            "the control plane's (the list `pulumi up` uploads and refuses to start without). Stops at the "
            "first that fails, saying which were built.",
        ),
    ] = False,
    role: Annotated[
        str | None,
        typer.Option(
            "--role",
            help="Build a control-plane image instead: 'etcd' (every etcd member, main and events) or "
            "'control-plane' (the apiservers). Written as <stack>-<role>.*; no rendered files are baked "
            "(each machine's own come with its custom data).",
        ),
    ] = None,
    binaries: Annotated[
        Path | None,
        typer.Option(
            "--binaries",
            help="Directory holding the pool's pinned binaries by file name (kubelet, cri-dockerd, crictl, ...; "
            "see node-image/binaries.toml), baked as given.",
        ),
    ] = None,
    fetch: Annotated[
        bool,
        typer.Option(
            "--fetch",
            help="Download the pool's binaries from their pinned URLs (node-image/binaries.toml); a digest mismatch "
            "is refused. A locked component's first download is recorded in node-image/binaries.lock.toml (your "
            "project's, made by `kilonode new`; commit it), later ones are verified against it.",
        ),
    ] = False,
    allow_incomplete: Annotated[
        bool,
        typer.Option(
            "--allow-incomplete",
            help="Build the image even when it lacks a program its units or conflists run, or a required "
            "binary (it says which); without it such a build is refused.",
        ),
    ] = False,
) -> None:
    """Build a pool's bootable disk image (--pool), a control-plane role's (--role), or every image
    the stack boots (--all: what `pulumi up` uploads, each pool's then etcd's and the control plane's).

    The base root filesystem (mmdebstrap from this machine's Debian mirror) is cached under
    ${XDG_CACHE_HOME:-~/.cache}/kilonode/rootfs/ by the hash of its inputs, so a rebuild
    that only changes artefacts takes seconds. Pinned downloads (--fetch) are kept, verified,
    under ${XDG_CACHE_HOME:-~/.cache}/kilonode/downloads/ and reused while their digest matches.
    Writes <stack>-<pool>.raw (GPT: ESP + ext4 root), <stack>-<pool>.vhd (fixed, for the Azure
    Compute Gallery), <stack>-<pool>.manifest.json (package versions, sha256 of every baked
    artefact and preloaded image, build inputs) and <stack>-<pool>.user-data (the pool's
    cloud-init user-data, for verify's seed).
    """
    # Imported here: the build/VM stack (paramiko among it) would otherwise slow every
    # other command's start.
    from kilonode.image.build import ROLE_IMAGES

    if (pool is not None) + (role is not None) + every != 1:
        die("give one of --pool NAME (a node pool's image), --role "
            f"{'|'.join(ROLE_IMAGES)} (the control plane's) or --all (every image the stack boots)",
            "kilonode image build")
    if role is not None and role not in ROLE_IMAGES:
        die(f"--role {role!r}: the roles are {', '.join(f'{k} ({v})' for k, v in ROLE_IMAGES.items())}",
            "kilonode image build")
    start = time.monotonic()
    stack_file, plan = load_and_plan(stack)
    wanted = ([(image.name, image.role) for image in plan.boot_images] if every
              else [(role, True)] if role is not None else [(str(pool), False)])
    built = _build_each(stack_file, plan, wanted, out_dir, every=every, binaries=binaries, fetch=fetch,
                        allow_incomplete=allow_incomplete)
    if every:
        out.print(f"[green]✓[/] {len(built)} images in {out_dir} in {time.monotonic() - start:.0f} s: "
                  f"{', '.join(built)}")


def _build_each(stack: Stack, plan: ClusterPlan, wanted: list[tuple[str, bool]], out_dir: Path, *, every: bool,
                binaries: Path | None, fetch: bool, allow_incomplete: bool) -> list[str]:
    """Build each (name, is a role) in turn; stop at the first failure, saying which were built."""
    from kilonode.image.build import build_image
    from kilonode.image.disk import DiskError
    from kilonode.image.rootfs import BuildError

    built: list[str] = []
    for number, (name, is_role) in enumerate(wanted, 1):
        if every:
            out.print(f"[bold]image {number}/{len(wanted)}: {name}[/] "
                      f"({'--role' if is_role else '--pool'} {name})")
        image_start = time.monotonic()
        progress = _Progress(image_start)
        try:
            inputs = _inputs(stack, plan, None if is_role else name, name if is_role else None)
            result = build_image(inputs, out_dir, progress=progress, binaries_dir=binaries, fetch=fetch,
                                 allow_incomplete=allow_incomplete)
        except (BuildError, DiskError) as error:
            progress.close()
            done = f" (built: {', '.join(built)})" if built else ""
            die(f"{name}: {error}{done}" if every else str(error), "kilonode image build")
        progress.close()
        _print_built(result, name if is_role else None, time.monotonic() - image_start)
        built.append(name)
    return built


def _print_built(result: BuildResult, role: str | None, elapsed_s: float) -> None:
    """What the build made, from its manifest: the files, and what the image lacks."""
    from kilonode.image.manifest import Manifest

    manifest = Manifest.load(result.manifest)
    out.print(f"[green]✓[/] {result.raw} ({'base reused from cache' if result.base_cached else 'base built'}) "
              f"in {elapsed_s:.0f} s")
    out.print(f"  VHD       {result.vhd}")
    out.print(f"  manifest  {result.manifest}: {len(manifest.data['packages'])} packages, "
              f"{len(manifest.artefacts)} artefacts, {len(manifest.preloaded_images)} preloaded image(s)")
    for binary in [*manifest.binaries, *manifest.data.get("other_binaries", [])]:
        if not binary["present"]:
            out.print(f"  [yellow]![/] {binary['name']}: {binary['origin']}")
    missing = [b["name"] for b in manifest.binaries if not b["present"]]
    if role is not None and missing:
        out.print(f"  [yellow]![/] the {role} image lacks {', '.join(missing)}: its VMs boot but never run "
                  f"{'etcd' if role == 'etcd' else 'the apiserver'}; for a cluster, build with --fetch (or --binaries)")
    for image in manifest.data.get("boot_images_not_supplied", []):
        out.print(f"  [yellow]![/] {image['image']}: {image['reason']}")
    gpu = manifest.data.get("gpu")
    if gpu:
        driver = gpu["driver"]
        out.print(f"  GPU       driver {driver['version']} ({driver['kernel_module']}) built for kernel "
                  f"{driver['kernel']}: {', '.join(m['path'].rsplit('/', 1)[-1] for m in driver['modules'])}")
        if not gpu["container_toolkit"]["present"]:
            out.print("  [yellow]![/] GPU containers cannot run on this image: the NVIDIA container toolkit is "
                      "absent, so the runtime keeps runc as its default (build with --fetch: it comes from NVIDIA's "
                      "apt repository, node-image/recipe.toml)")


@image_app.command()
def prepare(
    stacks: Annotated[
        list[str] | None,
        typer.Option(
            "--stack",
            help="Also prepare the bases this stack's pools need beyond the three plain ones: a GPU "
            "and/or InfiniBand pool's base (docker+gpu+infiniband, ...). Repeatable.",
        ),
    ] = None,
) -> None:
    """Build the cached base root filesystems (docker pools, containerd pools, and the etcd and
    control-plane images' "control" base) now, and those the --stack pools' sizes call for.

    `make test-artefacts` (and so `make test`) runs it, so later builds, and the tests, need
    no package mirror. Each base
    is made by mmdebstrap from this machine's Debian mirror (about 100 s; a GPU base, whose
    NVIDIA driver DKMS compiles for the image's kernel, takes minutes) and cached under
    ${XDG_CACHE_HOME:-~/.cache}/kilonode/rootfs/ by the hash of its inputs; a second run
    finds them and returns at once.
    """
    from kilonode.image.recipe import BaseSpec, load_recipe
    from kilonode.image.rootfs import BuildError
    from kilonode.image.rootfs import prepare as prepare_bases

    start = time.monotonic()
    wanted: list[BaseSpec] = []
    for stack_ref in stacks or []:
        _stack, plan = load_and_plan(stack_ref)
        wanted += [BaseSpec(p.runtime, p.image_extras) for p in plan.node_pools]
    progress = _Progress(start)
    try:
        bases = prepare_bases(load_recipe(), progress, tuple(spec for spec in wanted if spec.extras))
    except BuildError as error:
        progress.close()
        die(str(error), "kilonode image prepare")
    progress.close()
    for base in bases:
        out.print(f"  {base.key[:12]} {'cached' if base.cached else 'built'}: {base.tarball}")
    out.print(f"[green]✓[/] base root filesystems ready in {time.monotonic() - start:.0f} s")


@image_app.command()
def verify(
    image: Annotated[Path, typer.Argument(metavar="IMAGE", help="A built .raw or .vhd (its manifest beside it).")],
    host: Annotated[
        str | None,
        typer.Option("--host", help="user@addr[:port]: run the guest checks on this SSH host instead of a VM."),
    ] = None,
    identity: Annotated[Path | None, typer.Option("--identity", help="SSH private key for --host.")] = None,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the overlay, seed, logs and JUnit XML go.")
    ] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also copy the JUnit XML report here.")] = None,
    no_reboot: Annotated[bool, typer.Option("--no-reboot", help="Skip the reboot and persistence checks.")] = False,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Only the offline checks of the image file (no VM): baked files, hygiene, "
                     "and a GPU image's driver, kernel modules, firmware and runtime configuration."),
    ] = False,
    user_data: Annotated[
        Path | None,
        typer.Option("--user-data", help="Seed this cloud-init user-data instead of the pool's (try a change)."),
    ] = None,
) -> None:
    """Boot a fresh VM from IMAGE and run the testinfra suite; exit 1 naming each failed check.

    The VM boots a throwaway qcow2 overlay under UEFI (qemu, TCG), with a blank second disk
    as the local SSD and the pool's user-data as a NoCloud seed, the path Azure's custom
    data takes. Checks run in three phases: offline (the image file: baked artefacts,
    hygiene), first-boot (over SSH) and after-reboot (the persistence checks).
    """
    from kilonode.image.qemu import VmError
    from kilonode.image.verify import SshTarget, verify_image

    if not image.exists() and host is None:
        die(f"{image} not found", "kilonode image verify")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    work = workdir or Path("build") / "verify" / f"{image.stem}-{stamp}"
    start = time.monotonic()
    target = SshTarget.parse(host, identity) if host else None
    progress = _Progress(start)
    try:
        report = verify_image(
            image, workdir=work, host=target, reboot=not no_reboot, progress=progress,
            user_data=user_data.read_text() if user_data else None, boot=not offline,
        )
    except (FileNotFoundError, VmError, ValueError) as error:
        progress.close()
        die(str(error), "kilonode image verify")
    progress.close()
    if junit:
        junit.write_bytes(report.junit.read_bytes())
    for phase, counts in report.counts.items():
        out.print(f"  {phase:13} " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    out.print(f"  timings: {report.timings}")
    out.print(f"  JUnit XML: {report.junit}")
    if not report.passed:
        err.print(f"[bold red]✗ {len(report.failures)} check(s) failed:[/]")
        for failure in report.failures:
            print(f"FAILED {failure}")
        raise typer.Exit(code=ExitCode.FAILED)
    out.print(f"[green]✓[/] {image}: every check passed in {time.monotonic() - start:.0f} s")
