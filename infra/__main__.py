"""Pulumi entry point (Pulumi.yaml `main: infra/`): everything lives in infra.azure.program."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script, so `infra` itself is not on sys.path unless the
# project is pip-installed; the repository root is.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.azure.program import main

main()
