"""Exec -> go-plugin handshake: our plugin against a minimal Go go-plugin plugin, in one run.

    .venv/bin/python benchmarks/startup.py [--runs 20] [--plugin PATH ...] [--importtime] [--json FILE]

The baseline is built here, the way ``tests/conformance/build.py`` builds the
conformance host: Debian's go-plugin sources from /usr/share/gocode, GOPATH
mode, no module proxy, CGO off. It is the smallest plugin Nomad could launch:
``plugin.Serve`` with Nomad's handshake (protocol 2, Nomad's magic cookie)
and one gRPC plugin that registers nothing. Subjects are executables launched
exactly as Nomad launches a plugin (cookie and PLUGIN_PROTOCOL_VERSIONS in the
environment, stdout/stderr pipes): by default the console script in .venv;
``--plugin PATH`` (repeatable) adds others, e.g. the shipped self-contained
executable. Launches are interleaved (baseline, subject 1, subject 2, ...,
then again), so a busy box slows all of them alike; the ratios are what
carries over between machines, the milliseconds are not.

Our own modules are compiled to bytecode first (``__pycache__``, as a pip
install and the shipped executable have them): the dev venv's editable
install would otherwise compile them at every launch where
PYTHONDONTWRITEBYTECODE is set.

``--importtime`` also runs the console script's interpreter with
``-X importtime`` up to the handshake (median per module over 5 launches)
and splits the import time into the interpreter's own start-up (site),
grpcio + protobuf's own import, and everything else (ours and what only we
pull in).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conformance.build import SYSTEM_GOPATH  # noqa: E402

COOKIE = ("NOMAD_PLUGIN_MAGIC_COOKIE", "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255")

GO_PLUGIN = """\
package main

import (
	"context"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// nothing is a gRPC plugin that registers no service: the least a plugin can serve.
type nothing struct{ plugin.NetRPCUnsupportedPlugin }

func (nothing) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return nil }
func (nothing) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (interface{}, error) {
	return nil, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{
			ProtocolVersion:  2,
			MagicCookieKey:   "NOMAD_PLUGIN_MAGIC_COOKIE",
			MagicCookieValue: "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255",
		},
		Plugins:    map[string]plugin.Plugin{"device": nothing{}},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
"""


def build_go_baseline(workdir: Path) -> Path:
    """Compile the minimal Go plugin (GOPATH mode over Debian's sources, like the conformance host)."""
    gopath = workdir / "gopath"
    src = gopath / "src" / "minimalplugin"
    src.mkdir(parents=True)
    (src / "main.go").write_text(GO_PLUGIN)
    out = workdir / "minimal-go-plugin"
    env = dict(os.environ)
    env.update(
        GOPATH=f"{gopath}:{SYSTEM_GOPATH}",
        GO111MODULE="off",
        GOCACHE=str(REPO / "tests" / "conformance" / "bin" / ".cache"),
        GOFLAGS="",
        GOPROXY="off",
        CGO_ENABLED="0",
    )
    proc = subprocess.run(["go", "build", "-o", str(out), "minimalplugin"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"building the Go baseline failed:\n{proc.stdout}{proc.stderr}")
    return out


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env[COOKIE[0]] = COOKIE[1]
    env["PLUGIN_PROTOCOL_VERSIONS"] = "2"
    return env


def one_launch(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds from exec to the handshake line; the plugin is then stopped with SIGTERM (SIGKILL after 5 s)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        raise SystemExit(f"{cmd[0]}: no handshake within 60 s")
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    if not line.startswith(b"1|2|unix|"):
        proc.kill()
        raise SystemExit(f"{cmd[0]}: bad handshake line {line!r}")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    return elapsed


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def interpreter_of(script: Path) -> str | None:
    """The interpreter a Python console script runs under (its shebang), or None."""
    try:
        first = script.read_bytes()[:256].split(b"\n", 1)[0]
    except OSError:
        return None
    if not first.startswith(b"#!") or b"python" not in first:
        return None
    return first[2:].decode().strip().split()[0]


GRPC_ROOTS = ("grpc", "google", "grpc_health")


def attribute_imports(lines: list[str], floor: frozenset[str] = frozenset()) -> dict[str, float]:
    """Self time (us) of one -X importtime run, by who caused each import.

    A module counts for grpcio + protobuf when it, or the nearest of its
    importers that is not the standard library, belongs to them; for
    nomad_plugin likewise (so ``json`` imported by our logging is ours, and
    ``asyncio`` imported by grpc is grpc's); what nothing of either imported
    is the interpreter's own start-up (site, encodings, the console script).
    A module in ``floor`` (what ``import concurrent.futures, grpc`` loads by
    itself) counts for grpcio even when we happened to import it first: it is
    paid either way, so only the rest is really ours.
    """
    stack: list[tuple[int, str, int, list[object]]] = []
    for raw in lines:
        if not raw.startswith("import time:") or "self [us]" in raw:
            continue
        self_us, _cum, name = raw[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        children: list[object] = []
        while stack and stack[-1][0] > depth:
            children.insert(0, stack.pop())
        stack.append((depth, name.strip(), int(self_us), children))
    totals = {"interpreter start-up": 0.0, "grpcio + protobuf": 0.0, "nomad_plugin (and what it imports)": 0.0}

    def walk(node: tuple[int, str, int, list[object]], owner: str) -> None:
        _, name, self_us, children = node
        root = name.split(".")[0]
        if root in GRPC_ROOTS:
            owner = "grpcio + protobuf"
        elif root == "nomad_plugin":
            owner = "nomad_plugin (and what it imports)"
        totals["grpcio + protobuf" if owner != "grpcio + protobuf" and name in floor else owner] += self_us
        for child in children:
            walk(child, owner)  # type: ignore[arg-type]

    for node in stack:
        walk(node, "interpreter start-up")
    return totals


def import_breakdown(script: Path, env: dict[str, str], launches: int = 9) -> dict[str, object]:
    """-X importtime up to the handshake: ms by owner (median over launches) and our biggest modules."""
    python = interpreter_of(script)
    if python is None:
        raise SystemExit(f"--importtime: {script} is not a Python script")
    runs: list[dict[str, float]] = []
    ours: dict[str, list[int]] = {}

    def loaded(imports: str) -> set[str]:
        code = f"import sys{imports}; print(chr(10).join(sys.modules))"
        return set(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split())

    floor = frozenset(loaded(", concurrent.futures, grpc") - loaded(""))  # grpcio's, not the interpreter's
    for _ in range(launches):
        lines = _imports_before_handshake([python, "-X", "importtime", str(script)], env)
        runs.append(attribute_imports(lines, floor))
        for raw in lines:
            if raw.startswith("import time:") and "nomad_plugin" in raw:
                self_us, _cum, name = raw[len("import time:") :].split("|", 2)
                ours.setdefault(name.strip(), []).append(int(self_us))
    out: dict[str, object] = {key: round(statistics.median(r[key] for r in runs) / 1000, 1) for key in runs[0]}
    top = sorted(((statistics.median(v) / 1000, k) for k, v in ours.items()), reverse=True)[:6]
    out["biggest nomad_plugin modules (self)"] = {k: round(ms, 1) for ms, k in top}
    return out


def _imports_before_handshake(cmd: list[str], env: dict[str, str]) -> list[str]:
    """The stderr lines a process wrote before its handshake line (both pipes read in arrival order)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    err = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr, proc.stdout], [], [], 1.0)
            if proc.stderr in ready:  # stderr first: what was written before the handshake arrives first
                err += os.read(proc.stderr.fileno(), 1 << 16)
            if proc.stdout in ready:
                while select.select([proc.stderr], [], [], 0)[0]:
                    chunk = os.read(proc.stderr.fileno(), 1 << 16)
                    if not chunk:
                        break
                    err += chunk
                break
        else:
            raise SystemExit(f"{cmd}: no handshake within 60 s")
    finally:
        proc.kill()
        proc.wait()
    return err.decode(errors="replace").splitlines()


def one_exit(cmd: list[str]) -> float:
    """Seconds from exec to exit (for the interpreter-only baselines)."""
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="launches per executable (after one warm-up each)")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        help="an executable to measure (repeatable; default: the console script .venv/bin/nomad-device-lingjun)",
    )
    parser.add_argument("--importtime", action="store_true", help="also split the console script's import time")
    parser.add_argument("--json", help="write the results here as JSON too")
    args = parser.parse_args()
    console = REPO / ".venv" / "bin" / "nomad-device-lingjun"
    subjects = [Path(p).absolute() for p in args.plugin] or [console]
    for subject in subjects:
        if not os.access(subject, os.X_OK):
            raise SystemExit(f"--plugin: {subject} is not an executable file")
    if shutil.which("go") is None:
        raise SystemExit("go is missing: the Go baseline cannot be built (apt-get install golang-go ...)")
    env = launch_env()
    # The dev venv holds nomad_plugin as an editable install, so its bytecode is written on the
    # first import, except where PYTHONDONTWRITEBYTECODE is set (as on the development box):
    # then every launch compiled our sources again (6 ms of the 8.6 ms importtime gave "ours").
    # A pip install and the shipped executable carry compiled modules; compile ours the same way.
    compileall.compile_dir(REPO / "nomad_plugin", quiet=1)
    print("nomad_plugin's bytecode compiled into its __pycache__ first, as pip and the shipped executable have it")
    with tempfile.TemporaryDirectory(prefix="ljstart-") as tmp:
        go = build_go_baseline(Path(tmp))
        cmds = {"go-plugin (minimal Go)": [str(go)]} | {str(s): [str(s)] for s in subjects}
        # Floors for a Python plugin, exec -> exit: the interpreter alone, and it importing grpcio.
        python = interpreter_of(console) or sys.executable
        floors = {
            "python -c pass": [python, "-c", "pass"],
            # What the plugin imports of theirs before its handshake (the rest comes after it).
            "python: import concurrent.futures, grpc": [python, "-c", "import concurrent.futures, grpc"],
        }
        for cmd in cmds.values():  # warm the page cache and .pyc files; not counted
            one_launch(cmd, env)
        for cmd in floors.values():
            one_exit(cmd)
        times: dict[str, list[float]] = {name: [] for name in [*cmds, *floors]}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                times[name].append(one_launch(cmd, env) * 1000)
            for name, cmd in floors.items():
                times[name].append(one_exit(cmd) * 1000)
    base = statistics.median(times["go-plugin (minimal Go)"])
    result: dict[str, object] = {"runs": args.runs, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(f"exec -> handshake, {args.runs} interleaved launches each, {os.cpu_count()} CPUs")
    print("| executable | median | p95 | min | ratio to Go (median) |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        med = statistics.median(values)
        result[name] = {
            "median_ms": round(med, 1),
            "p95_ms": round(pct(values, 95), 1),
            "min_ms": round(min(values), 1),
        }
        result[name]["ratio"] = round(med / base, 1)  # type: ignore[index]
        print(f"| {name} | {med:.1f} ms | {pct(values, 95):.1f} ms | {min(values):.1f} ms | x{med / base:.1f} |")
    if len(subjects) > 1:
        first = statistics.median(times[str(subjects[0])])
        for other in subjects[1:]:
            print(f"{other} / {subjects[0]}: x{statistics.median(times[str(other)]) / first:.2f} (median)")
    if args.importtime:
        breakdown = import_breakdown(console, env)
        result["importtime_ms"] = breakdown
        print("-X importtime up to the handshake (console script, self time by who imported it, median of 9 launches):")
        for key, value in breakdown.items():
            print(f"  {key}: {value if isinstance(value, dict) else f'{value:.1f} ms'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
