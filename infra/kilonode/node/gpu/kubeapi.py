"""A small Kubernetes API client for the GPU health agent and its controller. It runs under
Debian's python3 on nodes, without the project's venv: the standard library, and PyYAML for
the kubeconfig (python3-yaml, which every image has through cloud-init; kilonode.node.ship).

Hand-written, not python3-kubernetes: adding it changes every image's package list and cached base, for 7 calls.
(tests/node/gpu/test_kubeapi_wire.py compares each call with the request the official client sends.)

Reads a kubeconfig (the kubelet's own after TLS bootstrap, or the controller's): JSON or YAML
(yaml.safe_load; imported only for YAML, so the agent's other paths need no more than the
standard library). TLS with the kubeconfig's CA and client certificate and key, as files or
base64 `-data` fields. Every request has a timeout; failures that may pass (connection errors, 429, 5xx) are
retried a bounded number of times with a growing pause.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bounds: a request that takes longer than this is dead (the apiserver's own default request
# timeout is 60 s, --request-timeout); a watch is held open longer and ended by the server's
# timeoutSeconds.
REQUEST_TIMEOUT_S = 30.0
RETRIES = 4
RETRY_PAUSE_S = 1.0

STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the file and the field."""


class ApiError(RuntimeError):
    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {body[:500]}")
        self.status = status
        self.body = body


# --- kubeconfig ----------------------------------------------------------------------------

def parse_yaml(text: str, where: str) -> Any:
    """The kubeconfig as YAML. Raises KubeconfigError naming the file and line."""
    import yaml  # python3-yaml on the node; the JSON path needs it not

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise KubeconfigError(f"{where}{line}: not YAML ({getattr(error, 'problem', None) or error})") from None


@dataclass(frozen=True)
class Kubeconfig:
    source: Path
    server: str
    ca_pem: bytes | None
    cert_pem: bytes
    key_pem: bytes


def _named(entries: Any, name: str, kind: str, where: str) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(kind), dict):
            return entry[kind]
    raise KubeconfigError(f"{where}: no {kind} named {name!r} in `{kind}s`")


def _material(section: dict[str, Any], field: str, base: Path, where: str) -> bytes | None:
    data = section.get(f"{field}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise KubeconfigError(f"{where}: {field}-data is not base64") from None
    path = section.get(field)
    if path:
        full = (base / path) if not os.path.isabs(path) else Path(path)
        try:
            return full.read_bytes()
        except OSError as error:
            raise KubeconfigError(f"{where}: {field} {full}: {error.strerror}") from None
    return None


def load_kubeconfig(path: Path) -> Kubeconfig:
    where = str(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise KubeconfigError(f"{where}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = parse_yaml(text, where)
    if not isinstance(data, dict):
        raise KubeconfigError(f"{where}: not a kubeconfig (no mapping at the top)")
    context_name = data.get("current-context")
    if not context_name:
        raise KubeconfigError(f"{where}: no current-context")
    context = _named(data.get("contexts"), context_name, "context", where)
    cluster = _named(data.get("clusters"), context.get("cluster", ""), "cluster", where)
    user = _named(data.get("users"), context.get("user", ""), "user", where)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith("https://"):
        raise KubeconfigError(f"{where}: cluster {context.get('cluster')!r} has no https:// server")
    base = path.parent
    cert = _material(user, "client-certificate", base, where)
    key = _material(user, "client-key", base, where)
    if not cert or not key:
        raise KubeconfigError(f"{where}: user {context.get('user')!r} needs client-certificate(-data) and "
                              "client-key(-data): this client authenticates with a certificate only")
    return Kubeconfig(path, server.rstrip("/"), _material(cluster, "certificate-authority", base, where), cert, key)


# --- the client ----------------------------------------------------------------------------

class Client:
    def __init__(self, config: Kubeconfig, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.config = config
        self.timeout = timeout
        url = urllib.parse.urlsplit(config.server)
        self.host = url.hostname or ""
        self.port = url.port or 443
        self.prefix = url.path.rstrip("/")
        self.context = self._tls(config)

    @staticmethod
    def _tls(config: Kubeconfig) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if config.ca_pem:
            try:
                context.load_verify_locations(cadata=config.ca_pem.decode())
            except (ssl.SSLError, UnicodeDecodeError) as error:
                raise KubeconfigError(f"{config.source}: the certificate authority does not load ({error})") from None
        # ssl loads a client certificate from files only: write them to a private temporary
        # directory, load, remove.
        with tempfile.TemporaryDirectory(prefix="kilonode-kubeapi-") as work:
            cert, key = Path(work) / "cert.pem", Path(work) / "key.pem"
            cert.write_bytes(config.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(config.key_pem)
            try:
                context.load_cert_chain(str(cert), str(key))
            except ssl.SSLError as error:
                raise KubeconfigError(f"{config.source}: the client certificate and key do not load "
                                      f"({error})") from None
        return context

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None) -> Any:
        """One API call, JSON in and out; retried on connection errors, 429 and 5xx. A 4xx
        other than 429 raises ApiError at once (409 Conflict is the caller's to handle)."""
        target = self.prefix + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "User-Agent": "kilonode-gpu-health"}
        if payload is not None:
            headers["Content-Type"] = content_type
        last: Exception | None = None
        for attempt in range(RETRIES):
            if attempt:
                time.sleep(RETRY_PAUSE_S * 2 ** (attempt - 1))
            connection = self._connection(self.timeout)
            try:
                connection.request(method, target, body=payload, headers=headers)
                response = connection.getresponse()
                text = response.read().decode(errors="replace")
            except (OSError, http.client.HTTPException) as error:
                last = error
                continue
            finally:
                connection.close()
            if response.status == 429 or response.status >= 500:
                last = ApiError(response.status, response.reason, text)
                continue
            if response.status >= 400:
                raise ApiError(response.status, response.reason, text)
            return json.loads(text) if text else None
        raise ApiError(0, "gave up", f"{method} {target} after {RETRIES} tries: {last}")

    def watch(self, path: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Watch events from `resource_version`, for at most timeout_s (the server ends the
        watch; the socket timeout is longer)."""
        query = urllib.parse.urlencode({"watch": "true", "resourceVersion": resource_version,
                                        "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "true"})
        connection = self._connection(timeout_s + self.timeout)
        try:
            connection.request("GET", f"{self.prefix}{path}?{query}",
                               headers={"Accept": "application/json", "User-Agent": "kilonode-gpu-health"})
            response = connection.getresponse()
            if response.status != 200:
                raise ApiError(response.status, response.reason, response.read().decode(errors="replace"))
            for line in response:
                if line.strip():
                    yield json.loads(line)
        finally:
            connection.close()

    # the calls agent and controller make
    def get_node(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/nodes/{urllib.parse.quote(name)}")

    def list_nodes(self) -> dict[str, Any]:
        # resourceVersion=0: served from the apiserver's watch cache, not a quorum read of
        # etcd; the controller's writes are conditional, so a list a moment old is harmless
        return self.request("GET", "/api/v1/nodes", query={"resourceVersion": "0"})

    def replace_node(self, node: dict[str, Any]) -> dict[str, Any]:
        """PUT: the apiserver refuses it with 409 when metadata.resourceVersion is stale."""
        return self.request("PUT", f"/api/v1/nodes/{urllib.parse.quote(node['metadata']['name'])}", node)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", f"/api/v1/nodes/{urllib.parse.quote(name)}/status", patch, STRATEGIC_MERGE)

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        namespace = event["metadata"]["namespace"]
        return self.request("POST", f"/api/v1/namespaces/{namespace}/events", event)

    def list_pods_on(self, node: str) -> list[dict[str, Any]]:
        answer = self.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"})
        return list(answer.get("items", []))
