"""Every outside fact kilonode relies on, as data with its source: what Azure, Kubernetes,
etcd and the upstream projects document, not what kilonode chooses (those are the plan's
defaults, kilonode.plan.defaults).

One loader style: a data file (YAML or TOML) beside its module, validated by a pydantic model
whose rows (or tables) each carry a `source`. Read by kilonode.config and kilonode.plan; the
renderers, the Pulumi components and the in-cluster modules read the plan instead.

- vm.py (vm_sizes.yaml, regions.yaml, vm_regions.yaml): VM sizes, region names, where each size is sold;
- limits.py (limits.yaml): Azure, Kubernetes and etcd limits and defaults;
- components.py (components.yaml): component versions per Kubernetes minor, image references;
- binaries.py (node-image/binaries.toml): the pinned upstream binaries of the node images;
- effects.py (effects.toml): what a changed input does to each Azure and in-cluster resource;
- rbac.py (rbac.yaml): the RBAC roles and bindings every apiserver creates for itself;
- escalations.py (escalations.yaml): the RBAC permissions upstream names as privilege-escalation paths, with
  what each lets a pod do and the narrower fix;
- kubelet_validation.py (kubelet_validation.yaml): the rules of upstream's ValidateKubeletConfiguration a
  stack's kubelet configuration could break;
- admission_plugins.py (admission_plugins.yaml): kube-apiserver's in-tree admission plugin names, and the
  plugins that cannot start without their AdmissionConfiguration entry (EventRateLimit, ImagePolicyWebhook);
- flag_validation.py (flag_validation.yaml): the start-time validation of kube-apiserver's, the controller
  manager's, the scheduler's and metrics-server's flags (what the program refuses, exiting);
- value_effects.py (value_effects.yaml): valid values whose effect upstream documents as dangerous, read by
  the review's `value-effect`;
- bounds.py (bounds.yaml): the programs that read a stack's numbers, and the type each reads them as;
- sysctls.py (sysctls.yaml): how the nodes' kernel reads each sysctl, and the hardening baselines;
- nat_gateway_alerts.py (nat_gateway_alerts.yaml): Azure Monitor's NAT gateway metrics and Microsoft's
  recommended alerts on them (read by the egress alerts component, kilonode.azure.egress_alerts, as
  the program reads binaries.toml: facts of Azure's, not choices the plan makes).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kilonode.yamlio import load_yaml

CATALOG_DIR = Path(__file__).resolve().parent
M = TypeVar("M", bound=BaseModel)

class Row(BaseModel):
    """A catalogue row or table: closed (an unknown key is a typo), immutable, camelCase keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


def read(path: Path) -> Any:
    """A data file's content: YAML or TOML by its suffix."""
    text = path.read_text(encoding="utf-8")
    return tomllib.loads(text) if path.suffix == ".toml" else load_yaml(text)


def load(model: type[M], path: Path) -> M:
    """A data file validated by its model."""
    return model.model_validate(read(path))
