"""Image references, read as the container runtimes read them."""

from __future__ import annotations


def registry_of(image: str) -> str:
    """The registry host of an image reference (Docker's rule: the first path part, when it
    has a dot or a colon or is localhost; otherwise Docker Hub)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"
