"""Rollouts: a pool's scale sets moved to their model (a new image version, new custom data) one
fabric at a time, gang-aware, gated, resumable (docs/operations.md, "Rolling a node image").

model: what the rollout sees (scale sets, instances, nodes, gangs, alerts) and its journal;
decide: the pure next step from those; observe/execute: the Azure and Kubernetes SDK calls
that read the state and carry the steps out; journal: the file that makes it resumable.
"""
