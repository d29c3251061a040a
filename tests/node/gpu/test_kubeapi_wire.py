"""The hand-written Kubernetes client (kilonode.node.gpu.kubeapi) against the official one
(the `kubernetes` package from PyPI): for each call the agent and controller make, both send
the same method, path, query, content type and body to a recording server on 127.0.0.1.
TLS is left out on both sides (plain HTTP): what is compared is the request, not the channel."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from kilonode.node.gpu import kubeapi
from kilonode.node.gpu.kubeapi import Client, Kubeconfig

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

Request = tuple[str, str, dict[str, list[str]], str | None, Any]


class Recorder(BaseHTTPRequestHandler):
    """Records each request; answers 200 with a small JSON document (one line, then closes)."""

    seen: list[Request]

    def _record(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.seen.append((self.command, url.path, urllib.parse.parse_qs(url.query),
                          self.headers.get("Content-Type") if raw else None, json.loads(raw) if raw else None))
        answer = b'{"kind": "Status", "items": []}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_PUT = do_PATCH = do_POST = _record

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, list[Request]]]:
    seen: list[Request] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


class PlainClient(Client):
    """kubeapi.Client with its TLS channel swapped for plain HTTP; every request it builds is its own."""

    @staticmethod
    def _tls(config: Kubeconfig) -> ssl.SSLContext:
        return ssl.create_default_context()

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)  # type: ignore[return-value]


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "nc-a100-000001", "resourceVersion": "4711"},
        "spec": {"taints": [{"key": "kilonode.io/gpu-health", "value": "pending", "effect": "NoSchedule"}]}}
STATUS_PATCH = {"status": {"conditions": [{"type": "GPUHealthy", "status": "True", "reason": "ChecksPassed"}]}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "gpu.1", "namespace": "default"},
         "involvedObject": {"kind": "Node", "name": "nc-a100-000001"}, "reason": "GPUHealthy", "type": "Normal"}

# call -> (the hand-written client's, the official client's), as the agent and controller make them
CALLS: dict[str, tuple[Callable[[Client], object], Callable[[Any], object]]] = {
    "get_node": (lambda c: c.get_node("nc-a100-000001"),
                 lambda k: k.read_node("nc-a100-000001", _preload_content=False)),
    "list_nodes": (lambda c: c.list_nodes(), lambda k: k.list_node(resource_version="0", _preload_content=False)),
    "replace_node (taint, untaint)": (lambda c: c.replace_node(NODE),
                                      lambda k: k.replace_node("nc-a100-000001", NODE, _preload_content=False)),
    "patch_node_status (the condition)": (
        lambda c: c.patch_node_status("nc-a100-000001", STATUS_PATCH),
        lambda k: k.patch_node_status("nc-a100-000001", STATUS_PATCH, _content_type=kubeapi.STRATEGIC_MERGE,
                                      _preload_content=False)),
    "create_event": (lambda c: c.create_event(EVENT),
                     lambda k: k.create_namespaced_event("default", EVENT, _preload_content=False)),
    "list_pods_on": (lambda c: c.list_pods_on("nc-a100-000001"),
                     lambda k: k.list_pod_for_all_namespaces(field_selector="spec.nodeName=nc-a100-000001",
                                                             _preload_content=False)),
    "watch nodes": (lambda c: list(c.watch("/api/v1/nodes", "4711", 5)),
                    lambda k: k.list_node(watch=True, resource_version="4711", timeout_seconds=5,
                                          allow_watch_bookmarks=True, _preload_content=False)),
}


@pytest.mark.parametrize("call", CALLS)
def test_each_call_sends_what_the_official_client_sends(server: tuple[int, list[Request]], call: str) -> None:
    port, seen = server
    ours, official = CALLS[call]
    ours(PlainClient(Kubeconfig(Path("test"), f"https://127.0.0.1:{port}", None, b"", b""), timeout=5))
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    with kubernetes.client.ApiClient(configuration) as api:
        official(kubernetes.client.CoreV1Api(api)).release_conn()  # type: ignore[attr-defined]
    assert len(seen) == 2, seen
    mine, theirs = seen
    if theirs[3] is None and theirs[4] is not None:
        # kubernetes 37 sends a JSON body for create and replace with no Content-Type header
        # (its rest.py serialises a dict as JSON when none is set); kubeapi names it
        theirs = (*theirs[:3], "application/json", theirs[4])
    assert mine == theirs


def test_the_comparison_sees_a_difference(server: tuple[int, list[Request]]) -> None:
    """A different query (a quorum read, not the watch cache) does not pass for the same request."""
    port, seen = server
    PlainClient(Kubeconfig(Path("test"), f"https://127.0.0.1:{port}", None, b"", b""), timeout=5).list_nodes()
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        kubernetes.client.CoreV1Api(api).list_node(_preload_content=False).release_conn()
    assert len(seen) == 2 and seen[0] != seen[1]
