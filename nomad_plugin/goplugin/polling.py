"""How grpcio's core moves the plugin's bytes: on the threads that already wait for them.

Why: grpcio (1.85) hands every socket to its EventEngine by default: four
``event_engine`` threads poll, and each message then crosses from one of
them to the Python thread waiting on the completion queue. The plugin's
traffic is a few small messages a second on Unix sockets (Nomad's Stats and
Fingerprint streams, XDM's exporter stream), so those hand-offs were about
a quarter of its steady-state CPU and thread switches. With the EventEngine
endpoints off, grpcio's own poller runs on the thread that waits for the
event. Measured with ``benchmarks/plugin_load.py`` (BENCHMARKS.md, issue
14): 86 -> 57 thread switches a second, about 15 % less plugin CPU.

It is grpcio's documented ``GRPC_EXPERIMENTS`` variable, read once when
grpcio is imported, so this runs first thing in the serving process. An
operator who sets ``GRPC_EXPERIMENTS`` (even empty) keeps their value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Container, MutableMapping

VARIABLE = "GRPC_EXPERIMENTS"
#: grpcio's EventEngine endpoints (client, listener, everything else) off.
DIRECT_POLLING = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def choose_polling(environ: MutableMapping[str, str] = os.environ, loaded: Container[str] = sys.modules) -> bool:
    """Default ``GRPC_EXPERIMENTS`` for this process; True when set here.

    Does nothing once grpc is imported (grpcio read its configuration then)
    or when the variable is already set.
    """
    if VARIABLE in environ or "grpc" in loaded:
        return False
    environ[VARIABLE] = DIRECT_POLLING
    return True
