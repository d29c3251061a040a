"""The report's answer: one line per decision, highest impact first, and what the review cannot
judge.

- One decision, one line: the risks that follow from the same decision in the same stack (their
  `cause`: a location change moves `location` on every resource, and the resource group, the VNet,
  the protected storage account and each refused in-place move are its fan-out) are one line, led
  by the gravest, with the others named after it and counted.
- Impact: the level first (high, then medium), then what a finding does to a running cluster
  (IMPACT: the cluster or its data lost; a fleet's capability lost: GPUs, alerting, connections,
  addresses; what reaches the Internet; `pulumi up` stopping partway; the rest), then the nodes it
  names, then how many resources.
- What no rule here models (NOT_JUDGED), and what this review could not check (each stack's notes:
  no promtool, a side's plan unreadable): said after the answer, so that "no risk found" is never
  read as "safe".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk

# Lower first. Rules not named here come after these, before the medium ones' own order.
IMPACT: dict[str, int] = {
    "stack-invalid": 0, "container-replaced": 0, "etcd-quorum": 0, "apiservers-all": 0, "etcd-data-lost": 1,
    "etcd-quota-lowered": 1, "etcd-leases-moved": 1, "address-moved": 1,
    "daemonset-stranded": 2, "daemonset-replaced": 2, "deployment-replaced": 2, "gpu-driver-mismatch": 2,
    "alert-rules-rejected": 2, "scrape-config-rejected": 2,
    "nsg-shadowed": 2,
    "connection-refused": 2, "workload-unplaceable": 2, "pool-shrink": 2, "version-skew": 2,
    "kubernetes-minor-jump": 2, "image-not-rebuilt": 2,
    "world-open": 3, "audit-log-off": 3, "daemonset-api-load": 3,
    "rollback-target-removed": 4, "replace-stops": 4, "update-refused": 4,
    "pool-resized": 5, "fleet-rollout": 6,
}
OTHER = 4
NOT_JUDGED = (
    "what the workloads themselves do (their code and configuration), the cluster's live state (what runs now, "
    "node health, etcd's size, quota and capacity in the region), changes made outside this repository, Azure and "
    "Kubernetes behaviour beyond the effects table and the models named in docs/review.md, what a scrape "
    "returns (promtool checks the config's syntax and the rule files), and load: a change with no risk found is "
    "not thereby safe")
_NODES = re.compile(r"([\d,]+) nodes")


@dataclass(frozen=True)
class Decision:
    lead: Risk
    others: tuple[Risk, ...] = ()

    @property
    def level(self) -> str:
        return self.lead.level

    def line(self) -> str:
        """The lead's rule, stack and whole summary; then each other risk of the decision, briefly."""
        if not self.others:
            return f"{self.lead.rule} ({self.lead.stack}): {self.lead.summary}"
        also = "; ".join(f"{r.rule}: {gist(r.summary)}" for r in self.others)
        return (f"{self.lead.rule} ({self.lead.stack}; one change, {self.lead.cause}, {len(self.others) + 1} "
                f"findings): {self.lead.summary}. The same change also: {also}")


def gist(summary: str, limit: int = 160) -> str:
    """A finding's opening clause: up to its first colon or parenthesis."""
    cut = min((i for i in (summary.find(": "), summary.find(" (")) if i > 0), default=len(summary))
    text = summary[:cut]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def order(risk: Risk) -> tuple[int, int, int, int]:
    nodes = max((int(n.replace(",", "")) for n in _NODES.findall(risk.summary) if n.replace(",", "")), default=0)
    return ((HIGH, MEDIUM).index(risk.level) if risk.level in (HIGH, MEDIUM) else 2,
            IMPACT.get(risk.rule, OTHER), -nodes, -len(risk.subjects))


def decisions(risks: Sequence[Risk]) -> list[Decision]:
    """The risks as decisions, highest impact first."""
    groups: dict[tuple[str, str], list[Risk]] = {}
    for index, risk in enumerate(risks):
        groups.setdefault((risk.stack, risk.cause or f"#{index}"), []).append(risk)
    found = []
    for members in groups.values():
        ranked = sorted(members, key=order)
        found.append(Decision(ranked[0], tuple(ranked[1:])))
    return sorted(found, key=lambda d: order(d.lead))
