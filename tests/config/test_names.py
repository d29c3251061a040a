"""Names that collide across namespaces: a pool may not take a name that makes two of the
program's resources one (two Pulumi resources with one URN, two Azure resources with one name, one
name twice in kilonode's graph). The rule (kilonode.config.checks: CLUSTER_PARTS,
CONTROL_PLANE_GROUPS, POOL_NAME_SUFFIX) is read back off the program's own recorded graph, and the
program is run with every name the graph suggests: those the rule lets through must give a graph
whose every name is unique. The refusals are hostile files (sem-name-*)."""

from __future__ import annotations

import collections
import re
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import AZURE_NAME_INPUT
from kilonode.config import load_stack
from kilonode.config.checks import CLUSTER_PARTS, POOL_NAME_SUFFIX
from kilonode.config.model import NAME_PATTERN, ROLE_IMAGES
from kilonode.problems import StackError
from tests.conftest import StackWriter
from tests.graphcache import recorded, recorded_program
from tests.shared import with_leases

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CLUSTER = "local"
POOL = "cpu"  # the local stack's pool


def _graph(write_stack: StackWriter, cluster: dict[str, Any]) -> Graph:
    return recorded(load_stack(str(write_stack(cluster))))


def _parts(graph: Graph) -> set[str]:
    """The names the program gives the cluster's own parts: the Cluster component's children and
    the stack's, less the cluster prefix."""
    top = {r.name for r in graph.resources if r.type == "kilonode:azure:Cluster"}
    return {r.name.removeprefix(f"{CLUSTER}-") for r in graph.resources
            if (r.parent is None or r.parent in top) and r.name.startswith(f"{CLUSTER}-")}


def _suffix_words(graph: Graph) -> set[str]:
    """The first word the program appends after the pool's name, in every name that holds it."""
    words = set()
    for r in graph.resources:
        match = re.search(rf"(?:^|-){POOL}-([^-]+)", r.name)
        if match:
            words.add(match.group(1))
    return words


@pytest.fixture(scope="module")
def leases_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    return recorded_program(CLUSTER, with_leases(CLUSTER))


def test_the_parts_the_rule_knows_are_the_programs_own(leases_graph: Graph) -> None:
    assert _parts(leases_graph) - {POOL} <= set(CLUSTER_PARTS), "add the program's new part to CLUSTER_PARTS"
    assert {"network", "tls", "apiserver", "etcd-leases", "k8s"} <= _parts(leases_graph)


def test_the_words_the_rule_knows_are_those_the_program_appends_to_a_pool(leases_graph: Graph) -> None:
    words = _suffix_words(leases_graph)
    assert words, "the pool's name is in no resource name"
    # a generation (g1) is always followed by more words (-id, -secret), so it makes no name alone; an
    # image version (1.0.0) holds dots, which no pool name does
    unknown = {w for w in words if not re.fullmatch(POOL_NAME_SUFFIX, w) and not re.fullmatch(r"g[0-9]+", w)
               and re.fullmatch(r"[a-z0-9]+", w)}
    assert not unknown, f"add these words to POOL_NAME_SUFFIX: {unknown}"


def _candidates(graph: Graph) -> set[str]:
    """Pool names that could collide, all read off the graph: every part's name, extended and cut
    short by a word; the first one and two words below each part (where the program puts the
    names of pools and of control-plane groups: ssh-key-apiservers); and the local pool's name
    extended by every word the program appends to it."""
    names = set()
    parts = _parts(graph) - {POOL}
    for part in parts:
        names |= {part, f"{part}-x", part.split("-")[0]}
        for r in graph.resources:
            tail = r.name.removeprefix(f"{CLUSTER}-{part}-")
            if tail != r.name:
                words = tail.split("-")
                names |= {words[0], "-".join(words[:2])}
    names |= {f"{POOL}-{word}" for word in _suffix_words(graph)} | {f"{POOL}-000-nat", f"{POOL}-nat-ips"}
    return {n for n in names if re.fullmatch(NAME_PATTERN, n) and n != POOL and n not in ROLE_IMAGES}


def _refused(write_stack: StackWriter, cluster: dict[str, Any], name: str) -> bool:
    pool = {**cluster["nodePools"][0], "name": name}
    pool.pop("subnet", None)
    try:
        load_stack(str(write_stack({**cluster, "nodePools": [*cluster["nodePools"], pool]})))
    except StackError as error:
        assert any("nodePools[1].name" in p.format("S") for p in error.problems), error.problems
        return True
    return False


def _duplicates(graph: Graph) -> list[str]:
    names = collections.Counter(r.name for r in graph.resources)
    # an Azure name is unique within its type and its parents (the resource group, the gallery, the
    # account...): the inputs that name them
    azure = collections.Counter(
        (r.type, r.inputs.get(AZURE_NAME_INPUT.get(r.type, ""), r.name),
         tuple(sorted((k, v) for k, v in r.inputs.items() if k.endswith("Name") and isinstance(v, str))))
        for r in graph.resources if r.type.startswith("azure-native:") and r.custom)
    return [n for n, c in names.items() if c > 1] + [f"{t} {n}" for (t, n, _), c in azure.items() if c > 1]


@pytest.mark.slow
def test_every_pool_name_the_rule_lets_through_gives_a_graph_of_unique_names(write_stack: StackWriter,
                                                                              leases_graph: Graph) -> None:
    cluster = with_leases(CLUSTER)
    candidates = sorted(_candidates(leases_graph))
    kept = [name for name in candidates if not _refused(write_stack, cluster, name)]
    assert len(kept) < len(candidates)  # the rule refuses some, and keeps some
    pools = [{**cluster["nodePools"][0], "name": name, "nodes": 1} for name in kept]
    for pool in pools:
        pool.pop("subnet", None)
    graph = recorded_program(CLUSTER, {**cluster, "nodePools": [*cluster["nodePools"], *pools]})
    assert {r.name for r in graph.resources} >= {f"{CLUSTER}-{name}" for name in kept}
    assert not _duplicates(graph)


def test_the_shipped_graphs_have_unique_names(leases_graph: Graph) -> None:
    assert not _duplicates(leases_graph)


@pytest.mark.parametrize("name", ["gpu", "gpu-spot", "a100-ib", "h100", "cpu-x", "cpu-2", "cpu-large", "networking",
                                  "tlsx", "api", "etcdx", "imagery", "system", "monitoring"])
def test_names_that_share_no_namespace_pass(write_stack: StackWriter, name: str) -> None:
    assert not _refused(write_stack, with_leases(CLUSTER), name)
