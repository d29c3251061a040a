"""The approver's loop: watch CertificateSigningRequests, decide each pending one
(.rules.decide), write the verdict through the approval subresource.

Runs on every apiserver VM, as kilonode-node-client-approver.service, with its own client
certificate (user kilonode:node-client-approver; kilonode.k8s.bootstrap grants it exactly:
get/list/watch CSRs, update certificatesigningrequests/approval, `approve` on the signer
kubernetes.io/kube-apiserver-client-kubelet, get Nodes, get its pool table's ConfigMap). The
pool table is that ConfigMap (kilonode.k8s.bootstrap writes it from the plan), read again for
each pending request: a pool's new scale set needs no change on the apiserver VMs.

Several replicas (one per apiserver VM), no leader election: each reads a CSR with its
resourceVersion and writes its verdict with it, so when two act on one CSR the second gets 409
Conflict and the next watch event shows the CSR decided; approving twice is harmless. What this
does not close: two replicas approving two *different* CSRs for one new name within the same
instant (each before its watch shows the other's approval). A kubelet retries with the same key
and subject, so the same CSR name (digestedName in pkg/kubelet/certificate/bootstrap); two CSRs
for one name means a second holder of the pool's token, racing a real VM's first request.

python3-kubernetes and python3-cryptography come with the control-plane image
(node-image/packages/control.txt).
"""

from __future__ import annotations

import argparse
import base64
import logging
import sys
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from .rules import (
    BOOTSTRAP_USER,
    NODE_USER_PREFIX,
    POOLS_CONFIGMAP,
    POOLS_KEY,
    POOLS_NAMESPACE,
    SIGNER,
    Decision,
    Pool,
    Request,
    decide,
    pools_from_json,
)

LOG = logging.getLogger("node-client-approver")
# A watch is ended by the server after this long and opened again (a fresh list first).
WATCH_TIMEOUT_S = 300
# Pause after an API failure before listing again; systemd restarts the process if it exits.
RETRY_PAUSE_S = 5.0


def _decided(csr: Any) -> bool:
    return any(c.type in ("Approved", "Denied") and c.status == "True" for c in (csr.status.conditions or []))


def _approved_node(csr: Any) -> str | None:
    """The node name of an approved *first* certificate request (from a bootstrap token user) of
    our signer, read from the request's subject. Renewals (users system:node:<name>) do not
    count: their node exists, and a name Azure reuses after a scale-in must not wait for
    kube-controller-manager's CSR cleaner (it deletes approved requests after an hour)."""
    approved = any(c.type == "Approved" and c.status == "True" for c in (csr.status.conditions or []))
    if not approved or csr.spec.signer_name != SIGNER or not BOOTSTRAP_USER.fullmatch(csr.spec.username or ""):
        return None
    try:
        cn = x509.load_pem_x509_csr(_pem(csr)).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        return None
    return str(cn[0].value).removeprefix(NODE_USER_PREFIX) if cn else None


def _pem(csr: Any) -> bytes:
    """The PEM request: the client gives the base64 `request` field as a str (format byte)."""
    request = csr.spec.request
    if isinstance(request, bytes):
        return request
    try:
        return base64.b64decode(request, validate=True)
    except ValueError:
        return str(request).encode()


def request_of(csr: Any) -> Request:
    return Request(name=csr.metadata.name, signer_name=csr.spec.signer_name, username=csr.spec.username or "",
                   groups=tuple(csr.spec.groups or ()), usages=tuple(csr.spec.usages or ()),
                   request_pem=_pem(csr), decided=_decided(csr))


class NodeNames:
    """`name in NodeNames(core)`: one GET of that Node (404: none). Not a LIST: a wave of joins
    would otherwise LIST every Node once per CSR on every replica."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def __contains__(self, name: object) -> bool:
        try:
            self.core.read_node(str(name))
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True


class Approver:
    def __init__(self, api: client.ApiClient) -> None:
        self.certificates = client.CertificatesV1Api(api)
        self.core = client.CoreV1Api(api)
        self.nodes = NodeNames(self.core)
        # node name -> the approved CSR for it, from the list and the watch (no extra calls)
        self.approved: dict[str, str] = {}

    def observe(self, csr: Any, deleted: bool = False) -> None:
        node = _approved_node(csr)
        if node is None:
            return
        if deleted:
            if self.approved.get(node) == csr.metadata.name:
                del self.approved[node]
        else:
            self.approved.setdefault(node, csr.metadata.name)

    def handle(self, csr: Any) -> Decision:
        self.observe(csr)
        request = request_of(csr)
        if request.signer_name != SIGNER or request.decided:
            return decide(request, (), (), {})
        decision = decide(request, self.pools(), self.nodes, self.approved)
        if decision.verdict != "skip":
            self._write(csr, decision)
        if decision.verdict == "approve" and decision.node is not None:
            self.approved.setdefault(decision.node, csr.metadata.name)
        return decision

    def pools(self) -> list[Pool]:
        """The pool table, read now (a ConfigMap GET): a table it cannot read approves nothing."""
        found = self.core.read_namespaced_config_map(POOLS_CONFIGMAP, POOLS_NAMESPACE)
        return pools_from_json((found.data or {})[POOLS_KEY])

    def _write(self, csr: Any, decision: Decision) -> None:
        kind = "Approved" if decision.verdict == "approve" else "Denied"
        condition = client.V1CertificateSigningRequestCondition(
            type=kind, status="True", reason=f"KilonodeNodeClient{kind}", message=decision.reason,
        )
        csr.status.conditions = [*(csr.status.conditions or []), condition]
        try:
            # carries the resourceVersion read: a CSR another replica decided meanwhile is a 409
            self.certificates.replace_certificate_signing_request_approval(csr.metadata.name, csr)
            LOG.info("%s %s: %s", kind.lower(), csr.metadata.name, decision.reason)
        except ApiException as error:
            if error.status == 409:  # another replica wrote first; the next event shows its verdict
                LOG.info("%s changed under us (another replica decided it)", csr.metadata.name)
                return
            raise

    def run_once(self) -> None:
        listed = self.certificates.list_certificate_signing_request()
        self.approved.clear()
        for csr in listed.items:
            self.observe(csr)
        for csr in listed.items:
            self.handle(csr)
        stream = watch.Watch().stream(self.certificates.list_certificate_signing_request,
                                      resource_version=listed.metadata.resource_version,
                                      timeout_seconds=WATCH_TIMEOUT_S)
        for event in stream:
            if event["type"] == "DELETED":
                self.observe(event["object"], deleted=True)
            elif event["type"] in ("ADDED", "MODIFIED"):
                self.handle(event["object"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    approver = Approver(config.new_client_from_config(str(args.kubeconfig)))
    while True:
        try:
            approver.run_once()
        except (ApiException, OSError, ValueError, KeyError) as error:
            LOG.warning("API failure, listing again in %.0f s: %s", RETRY_PAUSE_S, error)
            time.sleep(RETRY_PAUSE_S)


if __name__ == "__main__":
    sys.exit(main())
