#!/usr/bin/env python3
"""Regenerate nomad_plugin/_proto/ from the .proto sources under proto/.

Generated code is committed (so installing the plugin needs no protoc) and
tests/test_generated_protos.py fails when it is stale. The sources import each
other as ``nomad/x.proto``; Python's protoc plugin only emits absolute imports,
so the sources are staged under ``nomad_plugin/_proto/`` with their imports
rewritten, which makes every generated import package-qualified.

Usage: python tools/gen_protos.py [--out DIR]   (DIR defaults to the repo root)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "nomad_plugin/_proto"
FOLDERS = ("nomad", "goplugin", "lingjun")
IMPORT_RE = re.compile(r'^import "({})/'.format("|".join(FOLDERS)), re.M)


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # build-time dependency only

    include = Path(protoc.__file__).parent / "_proto"
    # protoc-gen-mypy and protoc-gen-mypy_grpc live beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        staged: list[str] = []
        for folder in FOLDERS:
            for src in sorted((ROOT / "proto" / folder).glob("*.proto")):
                rel = f"{PREFIX}/{folder}/{src.name}"
                dst = stage / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(IMPORT_RE.sub(rf'import "{PREFIX}/\1/', src.read_text()))
                staged.append(rel)
        for folder in FOLDERS:
            target = out_root / PREFIX / folder
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            (target / "__init__.py").write_text('"""Generated protobuf code: never edit by hand."""\n')
        args = [
            "protoc",
            f"-I{stage}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_out={out_root}",
            f"--mypy_grpc_out={out_root}",
            *staged,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    return sorted((out_root / PREFIX).rglob("*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT)
    ns = parser.parse_args()
    for path in generate(ns.out):
        print(path.relative_to(ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
