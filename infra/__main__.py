"""Pulumi entry point (Pulumi.yaml `main: infra/`): everything lives in infra.azure.program."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script: its own folder is sys.path[0], where infra's
# subpackages (azure, config, plan...) would shadow same-named top-level modules, and the
# repository root, from which `infra` imports, is missing unless the project is installed.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from infra.azure.program import main  # noqa: E402  (needs the path above)

main()
