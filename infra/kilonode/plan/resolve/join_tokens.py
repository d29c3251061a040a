"""Every pool's join tokens: one per registration group (the pool's shared shards, each team's
shards) and generation the stack names (joinTokens), the current generation first. A group's
names are its scale sets' computerNamePrefixes (the shard names, kilonode.azure.node_pool): what
its token may get a first client certificate for."""

from __future__ import annotations

from datetime import UTC

from kilonode.config.model import ClusterConfig, JoinTokenConfig
from kilonode.plan.model import JoinTokenPlan, NodePoolPlan


def join_tokens(config: ClusterConfig, pools: tuple[NodePoolPlan, ...]) -> tuple[JoinTokenPlan, ...]:
    tokens = config.join_tokens
    # no joinTokens: generation 1 without expiry (what kilonode made before tokens expired), so
    # the stack's existing tokens stay until the stack names a generation; preflight refuses it
    generations: list[tuple[JoinTokenConfig | None, bool]] = (
        [(None, True)] if tokens is None
        else [(tokens.current, True), *([(tokens.previous, False)] if tokens.previous else [])]
    )
    return tuple(
        JoinTokenPlan(
            pool=pool.name,
            generation=1 if token is None else token.generation,
            expires=None if token is None else rfc3339(token),
            current=current,
            prefixes=names,
            team=team,
        )
        for token, current in generations for pool in pools for team, names in _groups(pool)
    )


def _groups(pool: NodePoolPlan) -> list[tuple[str | None, tuple[str, ...]]]:
    """The pool's registration groups with shards, each with its scale sets' names: the shared
    shards (None), then each team's."""
    groups = [(team, tuple(s.name for s in pool.shards if s.team == team)) for team in (None, *pool.teams)]
    return [(team, names) for team, names in groups if names]


def rfc3339(token: JoinTokenConfig) -> str:
    """The form cluster-bootstrap parses (time.Parse(time.RFC3339), util/secrets GetExpiration):
    whole seconds, UTC, `Z`."""
    return token.expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
