"""Where the repository's data folders are: templates, sysctl profiles, stacks."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES_DIR = REPO_ROOT / "templates"
SYSCTL_DIR = REPO_ROOT / "sysctl"
STACKS_DIR = REPO_ROOT / "stacks"
NODE_IMAGE_DIR = REPO_ROOT / "node-image"
