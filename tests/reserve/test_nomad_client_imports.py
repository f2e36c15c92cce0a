"""The Nomad API client loads httpx, and nothing of httpx's command-line client."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_loads_httpx_without_its_command_line_client() -> None:
    cli_packages = [m for m in ("click", "rich", "pygments") if importlib.util.find_spec(m) is not None]
    assert cli_packages, "none of httpx's CLI packages is installed here, so this test would prove nothing"
    code = """
        import sys
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
        client = NomadClient(NomadApiSettings(address="http://127.0.0.1:9"))
        print("httpx" in sys.modules)
        client._http
        print("httpx" in sys.modules, sorted(m for m in ("click", "rich", "pygments") if m in sys.modules))
        import httpx
        print(type(client._http) is httpx.Client)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False", "True []", "True"], proc.stdout
