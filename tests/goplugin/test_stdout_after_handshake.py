"""After the handshake line nothing can reach stdout: not print, not fd 1, not a child.

go-plugin reads the plugin's stdout as the handshake; anything after it
would be taken as garbage by the agent. ``announce`` points fd 1 at stderr
for good, so a stray print, a C library writing to fd 1 or a child process
inheriting it all land on stderr instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, subprocess, sys
from nomad_plugin.goplugin.serve import announce
announce("1|2|unix|/tmp/x.sock|grpc\\n")
print("stray print")
sys.stdout.flush()
os.write(1, b"stray fd 1\\n")
subprocess.run([sys.executable, "-c", "print('stray child')"], check=True)
"""


def test_everything_after_the_handshake_goes_to_stderr() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"1|2|unix|/tmp/x.sock|grpc\n", done.stdout
    for stray in (b"stray print", b"stray fd 1", b"stray child"):
        assert stray in done.stderr, (stray, done.stderr)
