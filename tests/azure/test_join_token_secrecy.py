"""A join token's secret part never sits in the Pulumi state in plain text: it is a pulumi-random
RandomPassword (whose `result` the provider marks a secret output and whose ID is "none"), not a
RandomString (whose result and ID are the string itself, in plain text). Its ID half is public:
it names the token's Secret."""

from __future__ import annotations

import inspect

import pulumi_random

from kilonode.azure.graph import Graph


def test_every_join_token_secret_is_a_random_password(graphs: dict[str, Graph]) -> None:
    for stack, graph in graphs.items():
        secrets = [r for r in graph.resources if "-join-token-" in r.name and r.name.endswith("-secret")]
        assert secrets, stack
        assert {r.type for r in secrets} == {"random:index/randomPassword:RandomPassword"}, stack
        ids = [r for r in graph.resources if "-join-token-" in r.name and r.name.endswith("-id")]
        assert {r.type for r in ids} == {"random:index/randomString:RandomString"}, stack
        # the apiserver's bootstrap token format: [a-z0-9]{16}
        assert all(r.inputs["length"] == 16 and r.inputs["upper"] is False and r.inputs["special"] is False
                   for r in secrets)


def test_the_pinned_provider_marks_a_passwords_result_secret() -> None:
    """What the choice rests on, in the SDK this repository pins (random_password.py)."""
    source = inspect.getsource(pulumi_random.RandomPassword._internal_init)
    assert 'additional_secret_outputs=["bcryptHash", "result"]' in source
