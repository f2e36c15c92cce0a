"""Talk to the built Go oracle: JSON lines in, JSON lines out, one long-lived process."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHUNK = 128  # requests written before their answers are read (keeps both pipes far below their buffers)


class OracleError(RuntimeError):
    """The oracle process died or answered something that is not an answer."""


class GoOracle:
    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen(
            [str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self.info = self.one(op="info")

    def ask(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """One answer per request, in order."""
        answers: list[dict[str, Any]] = []
        batch = list(requests)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        for start in range(0, len(batch), CHUNK):
            chunk = batch[start : start + CHUNK]
            try:
                self._proc.stdin.write("".join(json.dumps(r) + "\n" for r in chunk))
                self._proc.stdin.flush()
            except BrokenPipeError as exc:
                raise OracleError(f"the Go oracle exited: {self._stderr()}") from exc
            for request in chunk:
                line = self._proc.stdout.readline()
                if not line:
                    raise OracleError(f"the Go oracle exited on {request!r}: {self._stderr()}")
                answer = json.loads(line)
                if "error" in answer:
                    raise OracleError(f"the Go oracle refused {request!r}: {answer['error']}")
                answers.append(answer)
        return answers

    def one(self, **request: Any) -> dict[str, Any]:
        return self.ask([request])[0]

    def _stderr(self) -> str:
        self._proc.kill()
        _, err = self._proc.communicate()
        return err.strip() or f"exit status {self._proc.returncode}"

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
