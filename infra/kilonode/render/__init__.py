"""Pure renderers: plan in, files out. No Pulumi, no network; templates are read from
templates/ (their paths mirror where each file lands on the host).

    render_cluster(plan) -> {"etcd-main-0": HostFiles, ..., "apiserver-0": ..., "pool-<name>": ...}

Each HostFiles maps a host path (relative to /, e.g. "etc/kubernetes/kubelet-config.yaml")
to a RenderedFile; the key USER_DATA holds the role's cloud-init user-data.
"""

from kilonode.render.cluster import render_cluster, render_tree
from kilonode.render.files import USER_DATA, HostFiles, RenderedFile

__all__ = ["USER_DATA", "HostFiles", "RenderedFile", "render_cluster", "render_tree"]
