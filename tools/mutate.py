"""`make mutate`: mutation testing of the critical modules, with a per-module report.

Why a driver around mutmut: mutmut reads its configuration only from
``[tool.mutmut]`` in pyproject.toml (which modules may be mutated, which test
files form the fast unit-test selection). This script picks the *subset* to
run (``MODULES=nomad/fingerprint,config/decode``), runs mutmut on those mutant
names only, and then turns mutmut's per-file result files
(``mutants/**/*.py.meta``) into one table:
killed / survived / equivalent per module, with the survivors listed.

Equivalent mutants (a change no test can observe because the behaviour is the
same) are listed with a one-line reason in tools/mutate_equivalent.txt; they
are counted apart and left out of the kill ratio. mutmut numbers mutants per
function in source order, so an entry goes stale when its function changes:
the report flags entries that no longer name a surviving mutant.

Not part of CI (a full run takes tens of minutes on two cores). Usage::

    make mutate                        # every module below
    make mutate MODULES=nomad/fingerprint   # a subset (comma or space separated)
    .venv/bin/python tools/mutate.py --report-only   # re-read the last results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "tools" / "mutate_equivalent.txt"

# Short name -> source files. Must agree with [tool.mutmut] only_mutate.
MODULES: dict[str, tuple[str, ...]] = {
    "nomad/fingerprint": ("nomad_plugin/nomad/fingerprint.py",),
    "nomad/reserve": ("nomad_plugin/nomad/reserve.py", "nomad_plugin/nomad/container.py"),
    "xdm/adapter": ("nomad_plugin/xdm/adapter.py",),
    "goplugin/handshake": ("nomad_plugin/goplugin/handshake.py",),
    "config/decode": ("nomad_plugin/config/decode.py",),
    "journal": ("nomad_plugin/journal/",),
    "reconcile": ("nomad_plugin/reconcile/",),
}

# mutmut's exit codes, grouped the way the report counts them.
_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 37: "killed"}
_TIMEOUT_CODES = {36, 24, -24, 152, 255}


def _status(code: int | None) -> str:
    if code is None:
        return "not checked"
    if code in _TIMEOUT_CODES:
        return "timeout"  # an endless loop caused by the mutant: the tests did notice
    return _STATUS.get(code, "suspicious")


def _mutant_glob(source: str) -> str:
    """``nomad_plugin/journal/`` -> ``nomad_plugin.journal.*`` (mutmut's mutant names)."""
    return source.removesuffix(".py").rstrip("/").replace("/", ".") + ".*"


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """``mutant-name  # reason`` lines; blank lines and lines starting with # are skipped."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        if not reason.strip():
            raise SystemExit(f"{path}: equivalent mutant {name.strip()!r} needs a '# reason'")
        out[name.strip()] = reason.strip()
    return out


@dataclass
class ModuleResult:
    counts: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """Killed / (killed + survived + no tests), equivalents excluded; timeouts count as killed."""
        killed = self.counts["killed"] + self.counts["timeout"]
        total = killed + self.counts["survived"] + self.counts["no tests"]
        return killed / total if total else None


def collect(modules: list[str], equivalents: dict[str, str]) -> dict[str, ModuleResult]:
    results: dict[str, ModuleResult] = {}
    for module in modules:
        result = ModuleResult()
        for source in MODULES[module]:
            base = ROOT / "mutants" / source
            metas = sorted(base.rglob("*.py.meta")) if source.endswith("/") else [Path(f"{base}.meta")]
            for meta in metas:
                if not meta.exists():
                    continue
                data = json.loads(meta.read_text(encoding="utf-8"))
                for name, code in sorted(data["exit_code_by_key"].items()):
                    status = _status(code)
                    if status in ("survived", "no tests") and name in equivalents:
                        result.counts["equivalent"] += 1
                        result.equivalent.append(name)
                        continue
                    result.counts[status] += 1
                    if status in ("survived", "no tests", "suspicious"):
                        result.survivors.append(name)
                    elif status == "not checked":
                        result.not_checked.append(name)
        results[module] = result
    return results


def render(results: dict[str, ModuleResult], equivalents: dict[str, str]) -> str:
    lines = [
        "| module | mutants | killed | survived | equivalent | no tests | not run | kill ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for module, r in results.items():
        c = r.counts
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.1%}"
        lines.append(
            f"| {module} | {sum(c.values())} | {c['killed'] + c['timeout']} | {c['survived']} "
            f"| {c['equivalent']} | {c['no tests']} | {c['not checked']} | {ratio} |"
        )
    for module, r in results.items():
        if r.survivors:
            lines.append(f"\nsurvivors in {module}:")
            lines.extend(f"  {name}" for name in r.survivors)
        if r.counts["not checked"]:
            lines.append(f"\n{module}: {r.counts['not checked']} mutants not checked yet (run it)")
    used = {name for r in results.values() for name in r.equivalent}
    prefixes = tuple(_mutant_glob(s).removesuffix("*") for m in results for s in MODULES[m])
    stale = sorted(n for n in equivalents if n.startswith(prefixes) and n not in used)
    if stale:
        lines.append("\nequivalents listed but not surviving (killed now, or renumbered: review):")
        lines.extend(f"  {name}" for name in stale)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("modules", nargs="*", help=f"subset of: {', '.join(MODULES)} (default: all)")
    parser.add_argument("--report-only", action="store_true", help="do not run mutmut, report the last results")
    parser.add_argument(
        "--rerun-survivors", action="store_true", help="run only the earlier survivors and not-run mutants again"
    )
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATE_JOBS", "2")))
    args = parser.parse_args(argv)
    modules = [m for arg in args.modules for m in arg.replace(",", " ").split()] or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {list(MODULES)}")
    if not args.report_only:
        globs = [_mutant_glob(s) for m in modules for s in MODULES[m]]
        # CI=1 loads the suite's derandomized hypothesis profile: the same
        # examples for the clean run and every mutant, so a kill is not luck.
        env = {**os.environ, "CI": "1"}
        mutmut = Path(sys.executable).with_name("mutmut")
        cmd = [str(mutmut), "run", "--max-children", str(args.jobs)]
        # mutmut runs every mutant it is given by name (or glob) again, whatever
        # it recorded before: a plain run is a complete, fresh measurement of
        # the chosen modules. --rerun-survivors runs only the earlier survivors,
        # not-run and no-tests mutants by name (after adding tests; mutmut first
        # collects which functions the new tests reach).
        if args.rerun_survivors:
            names = [n for r in collect(modules, {}).values() for n in (*r.survivors, *r.not_checked)]
            if not names:
                print("no earlier survivors to run", flush=True)
            else:
                print(f"+ {' '.join(cmd)} <{len(names)} earlier survivors>", flush=True)
                rc = subprocess.run([*cmd, *names], cwd=ROOT, env=env, check=False).returncode
                if rc != 0:
                    print(f"mutmut run exited {rc}", file=sys.stderr)
                    return rc
        else:
            print("+", " ".join([*cmd, *globs]), flush=True)
            rc = subprocess.run([*cmd, *globs], cwd=ROOT, env=env, check=False).returncode
            if rc != 0:
                print(f"mutmut run exited {rc}", file=sys.stderr)
                return rc
    equivalents = load_equivalents()
    print(render(collect(modules, equivalents), equivalents))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
