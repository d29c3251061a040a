"""Every TCP port the cluster's machines listen on (listeners.yaml): where each runs, the
address it binds, whether it authenticates a caller, who must reach it and what keeps everyone
else out, each with its source. kilonode.plan.listeners gives the ports their numbers (kilonode's
own are named by the constant that decides them); the node firewall, the NSGs and preflight's
`listeners` check read it there."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load

Hosts = Literal["etcd", "control-plane", "pools", "gpu-pools", "controller-pools", "prometheus-pod"]
Bind = Literal["loopback", "host", "all", "pod"]
Reacher = Literal["prometheus", "apiservers", "etcd", "kubelet", "nodes", "vnet", "deployer", "load-balancer",
                  "admins", "pods", "none"]
Guard = Literal["authentication", "loopback", "nsg", "node-firewall"]


class Listener(Row):
    id: str = Field(pattern=r"^[a-z0-9-]+$")
    program: str
    hosts: list[Hosts] = Field(min_length=1)
    # a number (0: one the kernel picks), or the UPPER_CASE name of the kilonode constant deciding it
    port: int | str = Field(union_mode="left_to_right")
    bind: Bind
    auth: str | None = None  # how a caller is authenticated; None: it is not
    reached_by: list[Reacher] = Field(min_length=1)
    guard: Guard
    source: list[str] = Field(min_length=1)
    note: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.auth is not None


class NotListening(Row):
    program: str
    why: str
    source: str


class Listeners(Row):
    listeners: list[Listener]
    not_listening: list[NotListening]


@cache
def catalogue() -> Listeners:
    return load(Listeners, CATALOG_DIR / "listeners.yaml")
