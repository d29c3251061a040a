"""node-join: a new VM of every pool can join now and for the next JOIN_TOKEN_WARN_DAYS, and
its token gets a certificate for no name but its own pool's.

1. The plan's join tokens (the stack's joinTokens): the current generation, which every scale
   set's custom data carries, must have an expiry at most JOIN_TOKEN_MAX_DAYS ahead
   (kilonode.config.tokens, the rule the stack loader applies too; a break without: a token that
   never expires lets whoever copied a VM's custom data join nodes forever) that has not passed (a break: the
   apiserver's bootstrap authenticator refuses an expired token, kube-controller-manager's token
   cleaner deletes its Secret, and no new VM of any pool joins: cluster-bootstrap util/secrets
   GetExpiration, pkg/controller/bootstrap/tokencleaner.go); a warning within
   JOIN_TOKEN_WARN_DAYS. A previous generation past its expiry is a warning: its Secret is gone,
   and naming it recreates it on the next refresh.
2. The recorded graph: no binding grants certificatesigningrequests:nodeclient (a break):
   kube-controller-manager would then approve any bootstrap token's first client certificate for
   any node name, an existing node's or an apiserver's included
   (pkg/controller/certificates/approver/sarapprove.go).
3. The render: every apiserver VM writes and starts the node client approver (a break without
   one anywhere: no first client certificate is approved and no VM joins).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import yaml

from kilonode.config import tokens as token_rules
from kilonode.plan import defaults
from kilonode.plan.model import JoinTokenPlan
from kilonode.preflight.model import Finding, Inputs
from kilonode.render.control_plane import NODE_CLIENT_APPROVER_SERVICE, NODE_CLIENT_APPROVER_UNIT
from kilonode.render.files import USER_DATA
from kilonode.yamlio import load_yaml

NAME = "node-join"
TITLE = "every pool's join token expires but not yet; only the node client approver approves a first node certificate"

NODECLIENT_ROLE = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
ROTATE = ("rotate: in the stack's joinTokens, move `current` to `previous`, set `current` to generation + 1 with a "
          "new `expires`, then `pulumi up` (docs/azure.md, \"Node join credentials\")")


def check(inputs: Inputs) -> list[Finding]:
    return [*_expiry_findings(inputs.plan.join_tokens, inputs.now), *_nodeclient_findings(inputs),
            *_approver_findings(inputs)]


def _generations(tokens: tuple[JoinTokenPlan, ...]) -> list[JoinTokenPlan]:
    """One token per generation (every pool's share generation and expiry)."""
    seen: dict[int, JoinTokenPlan] = {}
    for token in tokens:
        seen.setdefault(token.generation, token)
    return list(seen.values())


def _expiry_findings(tokens: tuple[JoinTokenPlan, ...], now: datetime) -> list[Finding]:
    findings = []
    for token in _generations(tokens):
        which = f"joinTokens.{'current' if token.current else 'previous'} (generation {token.generation})"
        expires = (None if token.expires is None
                   else datetime.strptime(token.expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo))
        # the stack loader refuses these too (kilonode.config.tokens: one rule, judged here as of --at)
        too_long = token_rules.lifetime_problem(expires, now)
        if too_long is not None or expires is None:
            findings.append(Finding(
                NAME, "break", "joinTokens" if token.expires is None else which, too_long or "",
                f"set joinTokens.current: {{generation: {token.generation}, expires: <RFC 3339 UTC, at most "
                f"{token_rules.JOIN_TOKEN_MAX_DAYS} days ahead>}} in the stack"))
            continue
        left = expires - now
        if not token.current:
            if left <= timedelta(0):
                findings.append(Finding(
                    NAME, "warn", which,
                    f"expired at {token.expires}: the token cleaner has deleted its Secrets; naming it makes the next "
                    "refreshed `pulumi up` recreate them, expired",
                    "remove joinTokens.previous from the stack"))
            continue
        if left <= timedelta(0):
            findings.append(Finding(
                NAME, "break", which,
                f"expired at {token.expires}: the apiserver refuses it and the token cleaner deleted its Secrets, so "
                "no new VM of any pool joins (the autoscaler's included); nodes that joined keep their certificates",
                ROTATE))
        elif left <= timedelta(days=defaults.JOIN_TOKEN_WARN_DAYS):
            findings.append(Finding(
                NAME, "warn", which,
                f"expires at {token.expires}, in {left.days} day(s): after that no new VM of any pool joins",
                ROTATE))
    return findings


def _nodeclient_findings(inputs: Inputs) -> list[Finding]:
    findings = []
    for r in inputs.kubernetes():
        if r.kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        role = (r.inputs.get("roleRef") or {}).get("name")
        if role != NODECLIENT_ROLE:
            continue
        subjects = ", ".join(f"{s.get('kind')} {s.get('name')}" for s in r.inputs.get("subjects") or [])
        findings.append(Finding(
            NAME, "break", r.describe(),
            f"grants {subjects} {role}: kube-controller-manager approves their first client certificate for any "
            "node name (it checks no name), so any join token can become an existing node or an apiserver's name",
            "remove the binding; the node client approver approves first certificates per pool "
            "(kilonode.k8s.bootstrap)"))
    return findings


def _approver_findings(inputs: Inputs) -> list[Finding]:
    apiservers = [h for h in inputs.hosts() if h.startswith("apiserver-")]
    running = [h for h in apiservers if _starts_approver(inputs.host_files(h))]
    if running or not apiservers:
        return []
    return [Finding(
        NAME, "break", ", ".join(apiservers),
        f"no apiserver VM writes and starts {NODE_CLIENT_APPROVER_SERVICE}: no kubelet's first client certificate "
        "is approved, so no VM of any pool joins",
        "render the approver's unit with the apiservers (kilonode.render.control_plane)")]


def _starts_approver(files: dict[str, str]) -> bool:
    try:
        user_data: Any = load_yaml(files.get(USER_DATA, "")) or {}
    except yaml.YAMLError:
        return False
    if not isinstance(user_data, dict):
        return False
    written = {str(f.get("path", "")).lstrip("/") for f in user_data.get("write_files") or [] if isinstance(f, dict)}
    started = [w for cmd in user_data.get("runcmd") or [] if isinstance(cmd, list)
               and cmd[:3] == ["systemctl", "enable", "--now"] for w in cmd[3:]]
    return NODE_CLIENT_APPROVER_UNIT in written and NODE_CLIENT_APPROVER_SERVICE in started
