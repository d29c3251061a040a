"""Pulumi's entry point (Pulumi.yaml `main: infra/`); the program is kilonode.azure.program."""

from kilonode.azure.program import main

main()
