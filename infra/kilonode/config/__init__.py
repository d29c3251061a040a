"""Typed cluster configuration, loaded and validated once at the boundary."""

from kilonode.config.load import Stack, available_stacks, load_stack, program_stack, stack_file, stack_from_value
from kilonode.config.model import ClusterConfig

__all__ = ["ClusterConfig", "Stack", "available_stacks", "load_stack", "program_stack", "stack_file",
           "stack_from_value"]
