"""joinTokens at the boundary: what a stack may say about the pools' join tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from kilonode.config.model import JoinTokensConfig
from kilonode.plan.resolve.join_tokens import rfc3339
from tests.conftest import StackWriter, shipped_cluster_value


def tokens(value: dict[str, Any]) -> JoinTokensConfig:
    return JoinTokensConfig.model_validate(value)


def test_an_unquoted_yaml_timestamp_is_refused_and_a_quoted_one_is_read_as_utc(write_stack: StackWriter) -> None:
    """Unquoted, a YAML timestamp is a date to PyYAML but reaches the Pulumi program as Go's
    time.String() text ('2027-05-31 02:00:00 +0000 UTC', which no datetime parser here takes):
    refused at its line, with the quotes to add (kilonode.config.reading)."""
    from kilonode.config import load_stack
    from kilonode.config.model import JoinTokensConfig
    from kilonode.problems import StackError

    cluster = shipped_cluster_value("local")
    cluster["joinTokens"] = {"current": {"generation": 3, "expires": datetime(2027, 5, 31, 2, tzinfo=UTC)}}
    path = write_stack(cluster)  # yaml.safe_dump writes it unquoted: a YAML timestamp
    with pytest.raises(StackError) as refused:
        load_stack(str(path))
    [problem] = refused.value.problems
    assert problem.path == "joinTokens.current.expires" and "write it in quotes" in problem.message
    with pytest.raises(ValidationError):  # what Pulumi would have handed the program
        JoinTokensConfig.model_validate({"current": {"generation": 3, "expires": "2027-05-31 02:00:00 +0000 UTC"}})
    cluster["joinTokens"] = {"current": {"generation": 3, "expires": "2027-05-31T02:00:00Z"}}
    config = load_stack(str(write_stack(cluster))).config
    assert config.join_tokens is not None
    assert rfc3339(config.join_tokens.current) == "2027-05-31T02:00:00Z"
    offset = tokens({"current": {"generation": 1, "expires": "2027-05-31T04:00:00+02:00"}})
    assert rfc3339(offset.current) == "2027-05-31T02:00:00Z"


@pytest.mark.parametrize(("value", "found"), [
    ({"current": {"generation": 1, "expires": "2027-05-31T00:00:00"}}, "timezone"),  # no zone: which day?
    ({"current": {"generation": 0, "expires": "2027-05-31T00:00:00Z"}}, "greater than or equal to 1"),
    ({"current": {"generation": 3, "expires": "2027-05-31T00:00:00Z"},
      "previous": {"generation": 1, "expires": "2027-01-31T00:00:00Z"}}, r"current\.generation - 1 \(2\)"),
    ({"current": {"generation": 3, "expires": "2027-05-31T00:00:00Z"},
      "previous": {"generation": 2, "expires": "2027-06-30T00:00:00Z"}}, "must not outlive the newer"),
    ({"current": {"generation": 1, "expires": "2027-05-31T00:00:00Z", "ttl": "90d"}}, "Extra inputs"),
])
def test_a_schedule_that_cannot_be_right_is_refused(value: dict[str, Any], found: str) -> None:
    with pytest.raises(ValidationError, match=found):
        tokens(value)


def test_an_expiry_beyond_the_longest_lifetime_or_no_tokens_at_all_is_refused_at_load(
        write_stack: StackWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """A year from now (KILONODE_NOW) is the most: 9999 is a token that never expires, which
    preflight calls a break; no joinTokens at all is refused too (every pool's VMs need one)."""
    from kilonode.config import load_stack
    from kilonode.config.tokens import NOW_ENV
    from kilonode.problems import StackError

    monkeypatch.setenv(NOW_ENV, "2026-12-01T00:00:00Z")
    cluster = shipped_cluster_value("local")
    cluster["joinTokens"] = {"current": {"generation": 1, "expires": "2027-12-01T00:00:00Z"}}
    load_stack(str(write_stack(cluster)))  # 365 days: the longest
    cluster["joinTokens"] = {"current": {"generation": 1, "expires": "2027-12-01T00:00:01Z"}}
    with pytest.raises(StackError) as refused:
        load_stack(str(write_stack(cluster)))
    [problem] = refused.value.problems
    assert problem.path == "joinTokens.current.expires" and "more than 365 days" in problem.message
    monkeypatch.setenv(NOW_ENV, "2027-01-01T00:00:00Z")  # judged later, the same file passes
    load_stack(str(write_stack(cluster)))
    del cluster["joinTokens"]
    with pytest.raises(StackError) as refused:
        load_stack(str(write_stack(cluster)))
    [problem] = refused.value.problems
    assert problem.path == "joinTokens" and "is required" in problem.message
