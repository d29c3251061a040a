"""What preflight reads (Inputs) and what it says (Finding)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from kilonode.config.tokens import NOW_ENV
from kilonode.plan.model import ClusterPlan

# "break": bring-up stops there (a node never Ready, a pod never scheduled, a run that fails);
# "warn": it works, at a cost or a risk the finding names.
Level = Literal["break", "warn"]


class InputError(ValueError):
    """The artefacts cannot be read as preflight needs them: which file, what is wrong."""


def parse_time(text: str, what: str) -> datetime:
    """An RFC 3339 time with its zone, in UTC; InputError naming `what` otherwise."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{what}: {text[:64]!r} is not a time like 2027-01-31T00:00:00Z") from None
    if at.tzinfo is None:
        raise InputError(f"{what}: {text[:64]!r} has no time zone: add Z (UTC) or an offset like +01:00")
    return at.astimezone(UTC)


def clock() -> datetime:
    """Preflight's now: KILONODE_NOW when set (kilonode.config.tokens.NOW_ENV, the stack loader's
    clock too), else the wall clock."""
    pinned = os.environ.get(NOW_ENV)
    return parse_time(pinned, NOW_ENV) if pinned else datetime.now(UTC)


@dataclass(frozen=True)
class Finding:
    check: str  # the check's stable name (CHECKS)
    level: Level
    where: str  # role/host/object/resource: "pool-gpu-a100", "Deployment kube-system/coredns", ...
    what: str  # what breaks, and how it shows on a running cluster
    fix: str  # what to change, where

    def to_json(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "where": self.where, "what": self.what, "fix": self.fix}


@dataclass(frozen=True)
class Resource:
    """One resource of the recorded graph, as `kilonode plan --format json` writes it
    (secrets masked)."""

    type: str
    name: str
    parent: str | None
    inputs: Mapping[str, Any]
    # the customTimeouts resource option, operation -> duration ("create": "40m"); none: the
    # provider's default
    custom_timeouts: Mapping[str, str] = field(default_factory=dict)
    # the ignoreChanges resource option: input paths a later `pulumi up` leaves as they were
    ignore_changes: tuple[str, ...] = ()

    @property
    def is_kubernetes(self) -> bool:
        return self.type.startswith("kubernetes:")

    @property
    def kind(self) -> str:
        """`kubernetes:apps/v1:Deployment` -> "Deployment"; an Azure type's last part likewise."""
        return self.type.rpartition(":")[2]

    def describe(self) -> str:
        """How a finding names it: a Kubernetes object by kind, namespace and name; an Azure
        resource by type and logical name."""
        if self.is_kubernetes:
            meta = self.inputs.get("metadata") or {}
            namespace = meta.get("namespace")
            name = meta.get("name", self.name)
            return f"{self.kind} {namespace}/{name}" if namespace else f"{self.kind} {name}"
        return f"{self.type} {self.name}"


@dataclass(frozen=True)
class Inputs:
    """Everything preflight reads. `files` is the render: "<host>/<path>" -> text, the host
    being a role directory of `kilonode render` (etcd-main-0, apiserver-1, pool-<name>, ...)
    and the path where the file lands on that host ("user-data": its cloud-init)."""

    plan: ClusterPlan
    files: Mapping[str, str]
    resources: tuple[Resource, ...]
    # the recorded graph's stack outputs (secrets masked): e.g. deployerEndpoint, what the
    # program's own kubeconfig names
    outputs: Mapping[str, Any] = field(default_factory=dict)
    # built images' manifests (kilonode image build), by image name; None: no images given
    images: Mapping[str, Mapping[str, Any]] | None = None
    source: str = ""  # where the inputs came from, for the report's heading
    # when preflight runs: what expiries (the pools' join tokens) are judged against
    now: datetime = field(default_factory=clock)
    _by_host: dict[str, dict[str, str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def hosts(self) -> list[str]:
        """The rendered host roles, in the render's order."""
        return list(self._split())

    def host_files(self, host: str) -> dict[str, str]:
        """The files of one host role: host path -> text."""
        return self._split().get(host, {})

    def _split(self) -> dict[str, dict[str, str]]:
        if not self._by_host:
            for key, text in self.files.items():
                host, sep, path = key.partition("/")
                if sep:
                    self._by_host.setdefault(host, {})[path] = text
        return self._by_host

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def kubernetes(self) -> Iterator[Resource]:
        return (r for r in self.resources if r.is_kubernetes)

    def workloads(self) -> list[Resource]:
        """Every Deployment, DaemonSet and StatefulSet the program creates."""
        kinds = {"Deployment", "DaemonSet", "StatefulSet"}
        return [r for r in self.kubernetes() if r.type.startswith("kubernetes:apps/") and r.kind in kinds]
