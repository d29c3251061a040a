"""catalogue-fact-changed: the fourteenth trace's PR 12 (calicoTypha.nodesPerReplica 200 -> 1000 in
limits.yaml, its source still citing 200) was "No risk found"; the review now says a changed catalogue fact, high
where the value no longer matches the source it cites."""

from __future__ import annotations

from pathlib import Path

from kilonode.review import catalogue_facts
from kilonode.review.finding import HIGH, MEDIUM

LIMITS = "infra/kilonode/catalog/limits.yaml"
TEXT = (Path(__file__).resolve().parents[2] / LIMITS).read_text(encoding="utf-8")
TYPHA = "  nodesPerReplica:\n    value: 200\n"


def test_a_value_moved_under_a_source_that_names_the_old_one_is_high() -> None:
    assert TYPHA in TEXT
    [(level, summary, subjects)] = catalogue_facts.assess({LIMITS: TEXT}, {LIMITS: TEXT.replace(
        TYPHA, TYPHA.replace("200", "1000"))})
    assert level == HIGH and subjects == ("limits.yaml",)
    assert "limits.yaml calicoTypha.nodesPerReplica.value 200 -> 1000 while its source still reads 200" in summary
    assert "maxNodesPerTypha := 200" in summary


def test_a_value_moved_with_its_source_is_medium() -> None:
    head = TEXT.replace(TYPHA, TYPHA.replace("200", "150"))
    head = head.replace("maxNodesPerTypha := 200", "maxNodesPerTypha := 150")
    [(level, summary, _)] = catalogue_facts.assess({LIMITS: TEXT}, {LIMITS: head})
    assert level == MEDIUM and "with a new source" in summary


def test_a_citation_reworded_alone_is_no_fact_changed() -> None:
    head = TEXT.replace("maxNodesPerTypha := 200; nodes / 200 + 1", "maxNodesPerTypha := 200, nodes / 200 + 1")
    assert head != TEXT
    assert catalogue_facts.assess({LIMITS: TEXT}, {LIMITS: head}) == []


def test_rows_added_are_counted() -> None:
    head = TEXT + "\nnewRow:\n  value: 3\n  source: 'somewhere'\n"
    [(level, summary, _)] = catalogue_facts.assess({LIMITS: TEXT}, {LIMITS: head})
    assert level == MEDIUM and "1 value(s) added (newRow.value...)" in summary
