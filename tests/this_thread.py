"""Faking a process-wide function for the calling thread only.

``monkeypatch.setattr(module.os, "write", fake)`` replaces ``os.write`` for the whole process:
a daemon thread another test left running (a gRPC server's helper, an HTTP double's handler)
would call the fake too, use up its scripted answers and add to what the test counts. A test
that fakes ``os`` or ``time`` for the code it drives on its own thread wraps the fake here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_this_thread(fake: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
    """``fake`` for calls from the thread that calls this, ``real`` for every other thread."""
    owner = threading.current_thread()

    def chosen(*args: Any, **kwargs: Any) -> Any:
        return (fake if threading.current_thread() is owner else real)(*args, **kwargs)

    return chosen
