"""The Nomad API double stays quiet when a client hangs up mid-answer.

A plugin stopped by its test may close its connection while the double is
still answering. socketserver would print a traceback from the handler
thread; on Python 3.11 printing one runs ast.parse, which can race another
thread's ast.parse into "SystemError: AST constructor recursion depth
mismatch" (seen in tests/hardening/test_source_rules.py under load).
"""

from __future__ import annotations

import socket
import time

from tests.doubles.nomad_api import NomadApiDouble
from tests.waiting import wait_until


def test_client_hanging_up_mid_answer_prints_nothing(capfd) -> None:  # type: ignore[no-untyped-def]
    with NomadApiDouble() as api:
        api.set_latency(0.3)
        host, port = api.address.removeprefix("http://").rsplit(":", 1)
        for _ in range(5):
            with socket.create_connection((host, int(port))) as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.sendall(b"GET /v1/agent/self HTTP/1.1\r\nHost: x\r\n\r\n")
            # closed with RST before the answer: the double's write fails
        wait_until(lambda: len(api.requests) == 5, "the double to take the 5 requests")
        time.sleep(0.6)  # let the last answers fail (only makes the check below stricter)
    _out, err = capfd.readouterr()
    assert "Traceback" not in err and "Exception occurred" not in err, err


# --- the node endpoint and the failure modes ------------------------------------------------------
def _raw_get(api: NomadApiDouble, path: str, timeout: float = 10.0) -> bytes:
    host, port = api.address.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def test_the_node_endpoint_answers_nomads_shapes() -> None:
    """Node.GetNode: the node (with unique.hostname) for its exact ID, 404 "node not found" otherwise;
    the allocation list of an unknown node is 200 [] (Node.GetAllocs never looks the node up)."""
    with NomadApiDouble(hostname="gpu-host-7") as api:
        node = _raw_get(api, f"/v1/node/{api.node_id}")
        assert node.startswith(b"HTTP/1.1 200") and b'"unique.hostname": "gpu-host-7"' in node
        assert _raw_get(api, f"/v1/node/{api.node_id[:8]}").startswith(b"HTTP/1.1 404"), "no prefix match"
        assert b"node not found" in _raw_get(api, "/v1/node/4c1a2b3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d")
        other = _raw_get(api, "/v1/node/4c1a2b3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d/allocations")
        assert other.startswith(b"HTTP/1.1 200") and other.endswith(b"[]")


def test_a_dripped_answer_comes_one_byte_at_a_time() -> None:
    with NomadApiDouble() as api:
        api.set_drip(0.01)
        started = time.monotonic()
        answer = _raw_get(api, "/v1/node/unknown")  # a short answer: 404 "node not found"
        assert answer.startswith(b"HTTP/1.1 404") and time.monotonic() - started >= 0.01 * len(answer) * 0.9


def test_each_fault_fails_every_request_its_way() -> None:
    with NomadApiDouble() as api:
        for fault, check in (
            ("status-500", lambda a: a.startswith(b"HTTP/1.1 500") and b"No cluster leader" in a),
            ("status-502", lambda a: a.startswith(b"HTTP/1.1 502")),
            ("not-json", lambda a: a.startswith(b"HTTP/1.1 200") and a.endswith(b"</html>")),
            ("truncated", lambda a: a.startswith(b"HTTP/1.1 200") and b"Content-Length" in a),
            ("reset", lambda a: a == b""),
        ):
            api.set_fault(fault)
            assert check(_raw_get(api, "/v1/agent/self")), fault
        api.set_fault(None)
        assert _raw_get(api, "/v1/agent/self").startswith(b"HTTP/1.1 200")
