"""Build ``dist/nomad-device-lingjun``: one executable file for Nomad's plugin_dir (shiv zipapp).

The file holds this package and its runtime dependencies (grpcio, protobuf,
msgpack, httpx, prometheus-client, python-hcl2 and what they need), copied
from the installed environment of the interpreter running this script, so
the build works offline and the bundled compiled wheels (grpcio, protobuf,
msgpack) match that interpreter's ABI exactly. The shebang therefore names
that interpreter's version (``/usr/bin/env python3.11`` when built with 3.11):
a node without it fails loudly ("env: 'python3.11': No such file") instead of
with an ImportError deep inside grpc. Linux x86_64 only (the wheels are).

Launched with Nomad's magic cookie and no arguments it serves the plugin;
otherwise it is the ``nomad-device-lingjun`` command (demo, doctor, ...).
On first run shiv extracts the dependencies to ``~/.shiv`` (or
``$SHIV_ROOT``); later runs reuse that cache.

    .venv/bin/python tools/build_zipapp.py [--output dist/nomad-device-lingjun] [--python /usr/bin/env python3.11]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "nomad-device-lingjun"
PACKAGE = "nomad_plugin"
ENTRY = "nomad_plugin.cli.main:main"
SKIP_PARTS = ("__pycache__",)


def _name(requirement: str) -> tuple[str, bool]:
    """(distribution name, applies) for a Requires-Dist line; extras-only requirements don't apply."""
    name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]
    marker = requirement.split(";", 1)[1] if ";" in requirement else ""
    if "extra ==" in marker:
        return name, False
    if marker:
        from packaging.markers import Marker

        return name, Marker(marker).evaluate()
    return name, True


def runtime_distributions(root: str = PROJECT) -> list[metadata.Distribution]:
    """The project's runtime dependency closure (no extras), as installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [req for req in metadata.requires(root) or []]
    while todo:
        name, applies = _name(todo.pop())
        key = name.lower().replace("_", "-")
        if not applies or key in seen:
            continue
        dist = metadata.distribution(name)
        seen[key] = dist
        todo += dist.requires or []
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def stage(site: Path) -> list[str]:
    """Copy the dependencies' installed files and this package into ``site``; return 'name version' lines."""
    shipped = []
    for dist in runtime_distributions():
        for file in dist.files or []:
            if any(part in SKIP_PARTS for part in file.parts) or file.parts[0] == ".." or file.suffix == ".pyc":
                continue
            src = Path(dist.locate_file(file))
            if src.is_file():
                dst = site / file
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        shipped.append(f"{dist.metadata['Name']} {dist.version}")
    shutil.copytree(REPO / PACKAGE, site / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    from nomad_plugin import __version__

    info = site / f"{PROJECT.replace('-', '_')}-{__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {__version__}\n")
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{PROJECT} = {ENTRY}\n")
    return shipped


def build(output: Path, python: str) -> dict[str, object]:
    shiv = Path(sys.executable).parent / "shiv"
    if not shiv.exists():
        raise SystemExit(f"shiv not found next to {sys.executable}: pip install shiv (it is in the dev extra)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zipapp-") as tmp:
        site = Path(tmp) / "site-packages"
        site.mkdir()
        shipped = stage(site)
        output.parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(shiv), "--site-packages", str(site), "-e", ENTRY, "-o", str(output), "-p", python,
               "--reproducible", "--compressed", "--no-modify", "--compile-pyc"]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    output.chmod(0o755)
    return {
        "output": str(output),
        "bytes": output.stat().st_size,
        "seconds": time.monotonic() - start,
        "bundled": shipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=REPO / "dist" / PROJECT)
    default_python = f"/usr/bin/env python{sys.version_info.major}.{sys.version_info.minor}"
    parser.add_argument("--python", default=default_python, help=f"shebang interpreter (default {default_python})")
    args = parser.parse_args(argv)
    result = build(args.output, args.python)
    size = int(result["bytes"])  # type: ignore[call-overload]
    print(f"built {result['output']}: {size / 2**20:.1f} MiB in {result['seconds']:.1f} s, shebang #!{args.python}")
    print("bundled: " + ", ".join(result["bundled"]))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
