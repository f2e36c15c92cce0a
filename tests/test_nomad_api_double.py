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

from nomad_plugin.testing.nomad_api import NomadApiDouble
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
