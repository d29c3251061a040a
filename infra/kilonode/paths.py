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

# A user's project: what `kilonode new` makes (Pulumi.yaml beside stacks/). The files kilonode
# writes or the user extends there, relative to the project: the image build's download locks
# (beside kilonode's recipe in the source tree; inside site-packages for an installed kilonode,
# where a reinstall replaces them) and the VM sizes the project adds to the packaged catalogue.
PROJECT_NODE_IMAGE = "node-image"
PROJECT_VM_SIZES = "catalog/vm_sizes.yaml"
# how messages name the packaged catalogue in kilonode's source tree
SOURCE_VM_SIZES = "infra/kilonode/catalog/vm_sizes.yaml"


def user_project(start: Path | None = None) -> Path | None:
    """The user's project kilonode runs in: the nearest folder at or above `start` (default:
    the working directory, which is the project's folder under `pulumi up` too) that holds a
    Pulumi.yaml, if it also holds stacks/ and is not kilonode's own source tree (which keeps
    its files where they are). None elsewhere."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Pulumi.yaml").is_file():
            own_source = folder == REPO_ROOT or (folder / "infra" / "kilonode" / "__init__.py").is_file()
            return None if own_source or not (folder / "stacks").is_dir() else folder
    return None


def node_image_lock(name: str, beside: Path = NODE_IMAGE_DIR) -> Path:
    """Where the lock file `name` (binaries.lock.toml, apt.lock.toml) of the recipe in `beside`
    lives: in a user's project, <project>/node-image/<name> for kilonode's own recipe (seeded by
    `kilonode new`); beside the recipe otherwise (the source tree, a test's own recipe)."""
    project = user_project()
    if project is not None and beside.resolve() == NODE_IMAGE_DIR.resolve():
        return project / PROJECT_NODE_IMAGE / name
    return beside / name


def shown_lock(name: str) -> str:
    """How advice names the lock file `name`: the file to commit."""
    project = user_project()
    if project is not None:
        return str(project / PROJECT_NODE_IMAGE / name)
    if REPO_ROOT is not None:
        return f"node-image/{name}"
    return (f"{NODE_IMAGE_DIR / name} (inside the installed kilonode, which a reinstall replaces: run kilonode "
            f"in your project, made by `kilonode new`, to keep it in <project>/node-image/)")


def shown_vm_sizes() -> str:
    """How advice names the file a VM size is added to."""
    project = user_project()
    if project is not None:
        return f"{project / PROJECT_VM_SIZES} (merged over kilonode's catalogue)"
    if REPO_ROOT is not None:
        return SOURCE_VM_SIZES
    return f"<project>/{PROJECT_VM_SIZES} in your project (made by `kilonode new`)"
