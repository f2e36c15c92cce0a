"""No tracked file names a package registry's host: the docs name the registry ("PyPI",
"Debian's archive"), and the build reads the mirror from the machine's own configuration.

The hosts come from this machine's configuration (apt's sources, pip's index), so the test
itself names none and follows whatever mirror a machine is set up with.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
APT = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def _configured_hosts() -> set[str]:
    texts = []
    for path in (APT[0], *sorted(APT[1].glob("*.list")), *sorted(APT[1].glob("*.sources"))):
        if path.is_file():
            texts += [line.split("#", 1)[0] for line in path.read_text(errors="replace").splitlines()]
    hosts = {urlsplit(url).hostname or "" for url in re.findall(r"(?:https?|ftp)://[^\s/]+", "\n".join(texts))}
    from pip._internal.models.index import PyPI  # pip's own idea of its default index

    hosts |= {PyPI.netloc, PyPI.file_storage_domain}
    return {host for host in hosts if re.fullmatch(r"[A-Za-z0-9.-]+\.[A-Za-z]{2,}", host)}


def test_no_tracked_file_names_a_registry_host() -> None:
    hosts = _configured_hosts()
    assert hosts, "found no registry host in this machine's configuration to look for"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    offenders = []
    for name in filter(None, tracked.decode().split("\0")):
        path = REPO / name
        if name.startswith("nomad_plugin/_proto/") or not path.is_file():
            continue
        text = path.read_bytes().decode(errors="replace")
        offenders += [f"{name}: {host}" for host in sorted(hosts) if host in text]
    assert not offenders, "name the registry, not its host: " + "; ".join(offenders)
