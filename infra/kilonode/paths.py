"""Where kilonode's data lives: templates, sysctl profiles, the node-image recipe, the image
verification suite (node-image/verify/) and the example stacks.

Installed from a wheel they sit under kilonode/_data/ (pyproject.toml maps them there); in a
source checkout (and an editable install) they are the repository's top-level folders.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_INSTALLED = PACKAGE_DIR / "_data"
# The checkout root, when running from one (None for a wheel install): the package is
# <root>/infra/kilonode/.
REPO_ROOT: Path | None = None if _INSTALLED.is_dir() else PACKAGE_DIR.parent.parent


def _data(installed: str, checkout: str) -> Path:
    return _INSTALLED / installed if REPO_ROOT is None else REPO_ROOT / checkout


TEMPLATES_DIR = _data("templates", "templates")
SYSCTL_DIR = _data("sysctl", "sysctl")
NODE_IMAGE_DIR = _data("node_image", "node-image")
# the testinfra suite `kilonode image verify` runs, beside the recipe it verifies
VERIFY_SUITE_DIR = NODE_IMAGE_DIR / "verify"
EXAMPLE_STACKS_DIR = _data("stacks", "stacks")
