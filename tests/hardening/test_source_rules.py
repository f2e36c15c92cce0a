"""Source rules checked on the package's AST, plus behaviour checks of the bounds they protect.

- no shell anywhere (shell=True, os.system, os.popen, commands/pty spawns, eval/exec);
- any subprocess call passes an argv list, never a built string;
- every queue in the plugin's runtime has a maxsize, every deque a maxlen,
  every lru_cache a maxsize; the metrics cache and journal are bounded.
"""

from __future__ import annotations

import ast
import subprocess
import threading
from pathlib import Path

import pytest

import nomad_plugin

PACKAGE = Path(nomad_plugin.__file__).parent
#: Code that runs inside the process Nomad launches. sim/ is the simulator, cli/ and launcher/
#: operator tools (run by hand, short-lived); they get the shell rules only.
RUNTIME_EXCLUDED = ("_proto", "sim", "cli", "launcher")


def _sources(runtime_only: bool) -> list[Path]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if rel[0] == "_proto" or (runtime_only and rel[0] in RUNTIME_EXCLUDED):
            continue
        out.append(path)
    return out


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found.append((ast.unparse(node.func), node))
    return found


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


FORBIDDEN_CALLS = {
    "os.system",
    "os.popen",
    "os.spawnl",
    "os.spawnlp",
    "os.spawnv",
    "os.spawnvp",
    "os.execl",
    "os.execlp",
    "os.execv",
    "os.execvp",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "pty.spawn",
    "eval",
    "exec",
}
SUBPROCESS_CALLS = {
    "subprocess.Popen",
    "subprocess.run",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
}


def test_scan_sees_the_package():
    assert len(_sources(False)) > 50 and len(_sources(True)) > 30


def test_no_shell_anywhere():
    problems = []
    for path in _sources(runtime_only=False):
        for name, node in _calls(path):
            if name in FORBIDDEN_CALLS:
                problems.append(f"{_where(path, node)}: {name}()")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    problems.append(f"{_where(path, node)}: shell={ast.unparse(kw.value)}")
    assert not problems, "\n".join(problems)


def test_subprocess_argv_is_never_a_built_string():
    """A command built by formatting (f-string, %, +, .format) could carry XDM or environment text into a shell-like parse."""
    problems = []
    for path in _sources(runtime_only=False):
        for name, node in _calls(path):
            if name not in SUBPROCESS_CALLS:
                continue
            argv = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "args"), None)
            if isinstance(argv, ast.JoinedStr | ast.BinOp | ast.Constant) or (
                isinstance(argv, ast.Call) and ast.unparse(argv.func).endswith(".format")
            ):
                problems.append(f"{_where(path, node)}: {name}({ast.unparse(argv)[:60]})")
    assert not problems, "\n".join(problems)


def test_runtime_has_no_subprocess_at_all():
    """The plugin process itself never spawns anything (nothing to inject into)."""
    problems = []
    for path in _sources(runtime_only=True):
        text = path.read_text()
        if "import subprocess" in text or "from subprocess" in text:
            problems.append(str(path.relative_to(PACKAGE.parent)))
    assert not problems, problems


def unbounded(source: str, where: str = "<src>") -> list[str]:
    """Unbounded queues, deques and caches created in ``source``."""
    problems = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            short = name.rsplit(".", 1)[-1]
            kwargs = {k.arg for k in node.keywords}
            line = f"{where}:{node.lineno}"
            if short in ("Queue", "LifoQueue", "PriorityQueue") and not node.args and "maxsize" not in kwargs:
                problems.append(f"{line}: {name}() without maxsize")
            if short == "SimpleQueue":
                problems.append(f"{line}: SimpleQueue cannot be bounded")
            if short == "deque" and len(node.args) < 2 and "maxlen" not in kwargs:
                problems.append(f"{line}: deque() without maxlen")
            if short == "lru_cache":
                size = next((k.value for k in node.keywords if k.arg == "maxsize"), node.args[0] if node.args else None)
                if size is None or (isinstance(size, ast.Constant) and size.value is None):
                    problems.append(f"{line}: lru_cache without maxsize")
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:  # bare @lru_cache / @cache are unbounded
                if isinstance(dec, ast.Name | ast.Attribute) and ast.unparse(dec).rsplit(".", 1)[-1] in (
                    "lru_cache",
                    "cache",
                ):
                    problems.append(f"{where}:{dec.lineno}: @{ast.unparse(dec)} is unbounded")
    return problems


def test_bound_scanner_catches_what_it_claims():
    bad = (
        "import queue, collections, functools\n"
        "q = queue.Queue()\nd = collections.deque()\ns = queue.SimpleQueue()\n"
        "@functools.lru_cache(maxsize=None)\ndef f(): pass\n@functools.cache\ndef g(): pass\n"
    )
    assert len(unbounded(bad)) == 5
    good = "import queue, collections\nq = queue.Queue(maxsize=8)\nd = collections.deque(maxlen=4)\n"
    assert unbounded(good) == []


def test_queues_and_caches_are_bounded():
    problems = []
    for path in _sources(runtime_only=True):
        problems += unbounded(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not problems, "\n".join(problems)


def test_metrics_cache_is_bounded():
    from nomad_plugin.model.metrics import MetricSample
    from nomad_plugin.stats.feed import MetricsCache

    cache = MetricsCache(max_entries=50)
    cache.update(MetricSample(f"dev-{n}", 1, "utilization", 1.0, 0) for n in range(500))
    assert len(cache) == 50
    assert cache.card("dev-499", "utilization") is not None and cache.card("dev-0", "utilization") is None


def test_journal_refuses_beyond_max_entries(tmp_path):
    from dataclasses import replace

    from nomad_plugin.journal.store import Journal, JournalFull
    from tests.fuzz.test_fuzz_journal import ENTRIES

    journal = Journal(tmp_path / "d", max_entries=2)
    journal.put(ENTRIES[0])
    journal.put(ENTRIES[1])
    with pytest.raises(JournalFull, match="limit 2"):
        journal.put(ENTRIES[2])
    journal.put(replace(ENTRIES[1], created_at=5.0))  # updating an existing grant is allowed
    assert len(journal) == 2


@pytest.mark.timeout(60)
def test_plugin_runtime_spawns_no_process(tmp_path, monkeypatch):
    """Drive the real PluginApp against the simulator with every spawn path trapped."""
    import os
    import shutil
    import tempfile

    from nomad_plugin.app import PluginApp
    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.sim import Simulator

    spawned: list[str] = []
    real_popen_init = subprocess.Popen.__init__

    def popen_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        spawned.append(repr(args[:1]))
        assert not kwargs.get("shell"), "shell=True"
        return real_popen_init(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen_init)
    monkeypatch.setattr(os, "system", lambda cmd: spawned.append(cmd) or 1)
    monkeypatch.setattr(os, "popen", lambda *a, **k: spawned.append(str(a)) or None)
    sockets = Path(tempfile.mkdtemp(prefix="hsp", dir="/tmp"))
    sim = Simulator(sockets, profile="h800-8").start()
    app = PluginApp()
    app.set_config(
        PluginConfig(
            backend="xdm",
            xdm_socket=str(sim.dp2mgr_path),
            config_socket=str(sim.config_path),
            data_dir=str(tmp_path / "data"),
            reconcile=False,
            nvml_enrich=False,
        )
    )
    cancel = threading.Event()
    try:
        responses = app.fingerprints(cancel)
        fp = next(responses)
        while not any(g.devices for g in fp.device_group):
            fp = next(responses)
        device = fp.device_group[0].devices[0].ID
        res = app.reserve([device])
        assert res.container_res.envs["LINGJUN_GRANT_ID"]
        stats = app.stats(1.0, cancel)
        next(stats)
    finally:
        cancel.set()
        app.close()
        sim.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    assert spawned == [], spawned


def _own_module_skips(text: str, label: str) -> list[str]:
    """``importorskip`` calls naming one of the project's own modules in ``text``."""
    found = []
    for node in ast.walk(ast.parse(text, filename=label)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if name == "importorskip" and isinstance(arg, ast.Constant):
            if str(arg.value).split(".")[0] in ("nomad_plugin", "tests"):
                found.append(f"{label}:{node.lineno}: importorskip({arg.value!r})")
    return found


def test_tests_never_skip_on_a_broken_import_of_the_project():
    """A broken import of the project's own code must fail, not turn into a skip."""
    tests_dir = Path(__file__).resolve().parents[1]
    offenders = [
        hit for path in sorted(tests_dir.rglob("*.py")) for hit in _own_module_skips(path.read_text(), str(path))
    ]
    assert offenders == []
    planted = 'import pytest\nsim = pytest.importorskip("nomad_plugin.sim")\nnp = pytest.importorskip("numpy")\n'
    assert _own_module_skips(planted, "x.py") == ["x.py:2: importorskip('nomad_plugin.sim')"]


def test_nothing_test_only_ships():
    """Test doubles live in tests/doubles: no module of the package imports the test tree."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert not (PACKAGE / "testing").exists(), "nomad_plugin/testing/ ships test doubles: they belong in tests/doubles"
    assert not offenders, offenders
