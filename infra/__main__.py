"""Pulumi entry point (Pulumi.yaml `main: infra/`): everything lives in kilonode.azure.program."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script: its own folder is sys.path[0], where the package's
# subpackages (azure, config, plan...) would shadow same-named top-level modules. `kilonode`
# itself comes from the project's virtualenv (`make setup` installs it, editable).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from kilonode.azure.program import main  # noqa: E402  (after the path fix above)

main()
