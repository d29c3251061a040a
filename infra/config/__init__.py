"""Typed cluster configuration, loaded and validated once at the boundary."""

from infra.config.load import Stack, available_stacks, load_stack, stack_file, stack_from_value
from infra.config.model import ClusterConfig

__all__ = ["ClusterConfig", "Stack", "available_stacks", "load_stack", "stack_file", "stack_from_value"]
