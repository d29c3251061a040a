"""Regenerate tests/golden/<stack>/ for every shipped stack, and the stack reference: `make golden`
(`python -m tests.golden.update`). Test tooling: it is not part of the installed package.

Each golden tree holds what `kilonode render <stack>` writes (the host files), under
in-cluster/ the Kubernetes objects the Pulumi program creates, as YAML, and in
resource-graph.txt its Azure resources, one input per line (both recorded under Pulumi's mock
engine, secrets masked). A pull request that changes a flag or an object shows that one line
changing. tests/render/test_golden.py compares the same `expected` trees with what is here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kilonode.azure.graph import RESOURCE_GRAPH_FILE, Graph, format_manifests, format_resource_graph
from kilonode.azure.mockplan import run_plan
from kilonode.config import Stack, available_stacks, load_stack
from kilonode.config.reference import REFERENCE_DOC, reference_markdown
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.render.cluster import render_tree
from kilonode.render.files import RenderedFile
from kilonode.render.write import with_marker, write_tree
from tests.graphcache import recorded
from tests.shared import with_leases

GOLDEN_DIR = Path(__file__).resolve().parent
REPO_ROOT = GOLDEN_DIR.parent.parent
# Variants of a shipped stack that no shipped stack shows (a golden tree each would repeat
# hundreds of identical files): variants/<name>/ holds only the files of the variant's tree
# that differ from its shipped stack's tree, or that it alone has; of the hosts it alone has,
# the first of each group (etcd-leases-0: the others differ by name and address only).
VARIANTS_DIR = GOLDEN_DIR / "variants"
# name -> (the shipped stack it varies, its cluster value)
VARIANTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    # the optional leases cluster (etcd.leases), three members shaped like the events cluster
    "local-leases": ("local", lambda: with_leases("local")),
}


def in_cluster(graph: Graph) -> dict[str, RenderedFile]:
    """in-cluster/<component>.yaml for each kilonode:k8s component of the recorded graph, and
    the Azure resources in resource-graph.txt."""
    files = {path: RenderedFile(text) for path, text in format_manifests(graph).items()}
    return files | {RESOURCE_GRAPH_FILE: RenderedFile(format_resource_graph(graph))}


def _tree(stack: Stack, graph: Graph | None = None) -> dict[str, RenderedFile]:
    return render_tree(stack.config, plan_stack(stack)) | in_cluster(graph or run_plan(stack))


def expected(stack_name: str, graph: Graph | None = None) -> dict[str, RenderedFile]:
    """Everything tests/golden/<stack>/ holds, its marker included (`graph`: the stack's
    recorded graph, when the caller has it)."""
    return with_marker(_tree(load_stack(stack_name), graph), stack_name)


def variant_stack(name: str, directory: Path) -> Stack:
    """Variant `name` written as a stack file in `directory`, named as its shipped stack (the
    stack's name is in its files: only what the variant changes should differ)."""
    shipped, value = VARIANTS[name]
    folder = directory / name
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"Pulumi.{shipped}.yaml"
    file.write_text(yaml.safe_dump({"config": {"kilonode:cluster": value()}}, sort_keys=False))
    return load_stack(str(file))


def variant_expected(name: str, graph: Graph | None = None, shipped_graph: Graph | None = None,
                     directory: Path | None = None) -> dict[str, RenderedFile]:
    """What tests/golden/variants/<name>/ holds: the variant's files that its shipped stack's tree
    lacks or has otherwise (`graph`: the variant's recorded graph, when the caller has it)."""
    shipped = VARIANTS[name][0]
    with tempfile.TemporaryDirectory(prefix="kilonode-variant-") as scratch:
        stack = variant_stack(name, directory or Path(scratch))
        tree = _tree(stack, graph or recorded(stack))
    base = _tree(load_stack(shipped), shipped_graph)
    hosts = {path.split("/", 1)[0] for path in base}
    return {path: file for path, file in tree.items()
            if (path not in base or base[path].content != file.content) and _shown(path.split("/", 1)[0], hosts)}


def _shown(host: str, shipped_hosts: set[str]) -> bool:
    """A host of the shipped stack, or the first of a group it lacks (etcd-leases-0)."""
    index = host.rpartition("-")[2]
    return host in shipped_hosts or not index.isdigit() or index == "0"


def regenerate_variants(variants_dir: Path = VARIANTS_DIR) -> list[str]:
    for name in VARIANTS:
        shutil.rmtree(variants_dir / name, ignore_errors=True)
        for path, file in variant_expected(name).items():
            target = variants_dir / name / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(file.content, encoding="utf-8")
            target.chmod(file.mode)
    return list(VARIANTS)


def regenerate(golden_dir: Path = GOLDEN_DIR) -> list[str]:
    names = available_stacks()
    for name in names:
        stack = load_stack(name)
        # the goldens live in git: replace them whole (a hand edit there is what this undoes)
        shutil.rmtree(golden_dir / name, ignore_errors=True)
        write_tree(_tree(stack), golden_dir / name, stack=name)
    for stale in sorted(p for p in golden_dir.iterdir() if p.is_dir() and p.name not in names
                        and p.name not in ("__pycache__", VARIANTS_DIR.name)):
        print(f"note: {stale} belongs to no shipped stack; delete it if the stack is gone", file=sys.stderr)
    return names


def regenerate_reference() -> Path:
    """docs/stack-reference.md, from the model (kilonode.config.reference), and
    docs/preflight.md, from the checks (kilonode.preflight.report)."""
    from kilonode.preflight import report

    (REPO_ROOT / report.PAGE).write_text(report.reference_markdown(), encoding="utf-8")
    target = REPO_ROOT / REFERENCE_DOC
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(reference_markdown(), encoding="utf-8")
    return target


# docs/nccl-job.md: each marker names a `kilonode gpu nccl-job` command; the ```yaml block that
# follows it is that command's output (tests/k8s/test_nccl_job.py keeps them equal).
NCCL_JOB_DOC = REPO_ROOT / "docs" / "nccl-job.md"
NCCL_JOB_MARKER = re.compile(r"(<!-- generated: kilonode (gpu nccl-job [^>]*?) -->\n)(\n```yaml\n.*?```\n)?", re.S)


def cli_output(args: list[str]) -> str:
    """What `kilonode ARGS` prints (run in this process, as the installed command runs it)."""
    from typer.testing import CliRunner

    from kilonode.cli import app

    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"kilonode {shlex.join(args)}: exit {result.exit_code}: {result.output}")
    return result.stdout


def nccl_job_doc(text: str) -> str:
    """The page with every marker followed by its command's output."""
    return NCCL_JOB_MARKER.sub(
        lambda m: f"{m.group(1)}\n```yaml\n{cli_output(shlex.split(m.group(2)))}```\n", text)


def regenerate_nccl_job_doc() -> Path:
    NCCL_JOB_DOC.write_text(nccl_job_doc(NCCL_JOB_DOC.read_text(encoding="utf-8")), encoding="utf-8")
    return NCCL_JOB_DOC


if __name__ == "__main__":
    try:
        for written in regenerate():
            print(f"regenerated {GOLDEN_DIR}/{written}")
        for written in regenerate_variants():
            print(f"regenerated {VARIANTS_DIR}/{written}")
        print(f"regenerated {regenerate_reference()}")
        print(f"regenerated {regenerate_nccl_job_doc()}")
    except StackError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
