"""Layers that point one way (docs/architecture.md), checked on every module's imports.

Each ``.py`` file of the package is parsed with ``ast``; every ``import`` and
``from ... import`` counts, wherever it stands: at the top, inside a function
(the plugin defers many imports to keep its three launches cheap) or under
``TYPE_CHECKING`` (a type-only import is still a dependency of the design).
``from package import name`` counts as an import of ``package.name`` when that
is a module. The rule table below is the contract; a new exception goes in the
table with its reason, never in the code.

The checker itself is exercised: each import that was removed to reach this
shape is put back (appended to the file's source, in a function and under
TYPE_CHECKING), and the check must then fail.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import nomad_plugin

PACKAGE = Path(nomad_plugin.__file__).parent
ROOT = "nomad_plugin"


@dataclass(frozen=True)
class Rule:
    """Modules under ``layer`` (a dotted prefix) must not import anything under ``forbidden``."""

    layer: str
    forbidden: tuple[str, ...]
    why: str


#: Everything that does I/O or speaks a wire format: the domain (model/) imports none of it.
_IO_LAYERS = (
    "goplugin",
    "nomad",
    "xdm",
    "nvml",
    "journal",
    "reconcile",
    "sim",
    "cli",
    "app",
    "backend_select",
    "stats",
    "metrics",
    "launcher",
    "_proto",
)

#: The one-way rule, layer by layer (names are dotted prefixes; ``nomad_plugin.`` is implied unless the
#: name is a third-party package).
RULES: tuple[Rule, ...] = (
    Rule(
        "goplugin",
        (
            *(layer for layer in _IO_LAYERS if layer not in ("goplugin", "_proto")),
            *("model", "config", "jobspec", "nomad_view", "_proto.nomad", "_proto.lingjun"),
        ),
        "the transport is a leaf: it hosts whatever servicers the composition root (app.py, through cli/main.py's serve) hands it",
    ),
    Rule(
        "nomad",
        ("app", "cli", "backend_select", "xdm", "nvml"),
        "Nomad's services see the engines, and the backends behind them, through the ports of nomad/services.py",
    ),
    Rule(
        "config",
        (*(layer for layer in _IO_LAYERS if layer != "_proto"), "model", "jobspec", "nomad_view"),
        "settings sit below every layer that reads them (ConfigError is config's own); the schema is hclspec",
    ),
    Rule(
        "util",
        (*_IO_LAYERS, "model", "config", "jobspec", "nomad_view"),
        "util/ holds helpers with no domain knowledge, below every layer",
    ),
    Rule(
        "model",
        (*_IO_LAYERS, "grpc", "httpx", "pynvml", "prometheus_client", "socket", "subprocess"),
        "the domain is pure: no I/O layer, no wire, no network",
    ),
    Rule("xdm", ("nomad", "app", "cli", "backend_select"), "a hardware backend serves the domain, not Nomad"),
    Rule("nvml", ("nomad", "app", "cli", "backend_select"), "a hardware backend serves the domain, not Nomad"),
    Rule("jobspec", ("launcher", "cli", "app"), "job-spec evaluation reads nomad_view/, not the launcher"),
    Rule("reconcile", ("nomad", "app", "cli"), "reconcile/ releases through its GrantReleaser port"),
    Rule("journal", ("nomad", "reconcile", "app", "cli"), "the journal sits below whoever releases"),
    Rule("nomad_view", ("launcher", "jobspec", "cli", "app", "nomad", "_proto"), "a neutral view both sides use"),
    Rule("launcher", ("cli", "app", "nomad"), "the go-plugin client launches the plugin; it does not embed it"),
    Rule("sim", ("nomad", "app", "cli"), "the simulator stands in for XDM and knows nothing of the plugin"),
    Rule("sim.control", ("sim.simulator",), "the simulator imports its control channel, not the reverse"),
)

#: Cycles between top-level subpackages that exist on purpose or are not yet broken, with the reason.
KNOWN_CYCLES: Mapping[frozenset[str], str] = {}

#: Cycles between modules that exist and are not yet broken, with the reason.
KNOWN_MODULE_CYCLES: Mapping[frozenset[str], str] = {}

#: Outside goplugin/, only these may import it: the entry point and the composition root, and the go-plugin
#: client that launches the plugin (it sends the handshake's cookie). Every other module logs with
#: ``logging.getLogger(__name__)`` and sees the transport through a port.
TRANSPORT = "goplugin"
TRANSPORT_IMPORTERS = ("app", "cli.main", "launcher.process")

#: Imports of goplugin/ from elsewhere that are still there: (importer, or "*" for any; imported module) -> why.
#: Each goes once its importers are swept; test_the_transport_exceptions_are_still_needed says when.
KNOWN_TRANSPORT_IMPORTS: Mapping[tuple[str, str], str] = {}


THIRD_PARTY = frozenset({"grpc", "httpx", "pynvml", "prometheus_client", "socket", "subprocess"})


def _qualified(name: str) -> str:
    return name if name in THIRD_PARTY else f"{ROOT}.{name}"


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (resolved, absolute)
    where: str  # file:line, relative to the repository


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by dotted name, generated ``_proto`` code included."""
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [ROOT, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


#: A string that names a module of the package, as ``importlib.import_module`` or a dispatch table takes it
#: ("nomad_plugin.cli.doctor", "nomad_plugin.app:serve").
STRING_IMPORT = re.compile(rf"{ROOT}(?:\.[a-z_][a-z0-9_]*)+(?::[A-Za-z_][A-Za-z0-9_]*)?")


@functools.lru_cache(maxsize=512)
def imports_of(module: str, source: str, filename: str, known: frozenset[str]) -> tuple[Import, ...]:
    """All imports in one file, wherever they stand, resolved to absolute module names; a string naming
    one of the package's modules counts as an import of it (the command table's ``importlib`` imports)."""
    tree = ast.parse(source, filename=filename)
    package = module if filename.endswith("__init__.py") else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and STRING_IMPORT.fullmatch(node.value):
            target = node.value.partition(":")[0]
            if target in known:
                found.append(Import(module, target, where))
        elif isinstance(node, ast.Import):
            found += [Import(module, alias.name, where) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                origin = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                found.append(Import(module, candidate if candidate in known else origin, where))
    return tuple(found)


def all_imports(package_dir: Path = PACKAGE, extra: Mapping[str, str] | None = None) -> list[Import]:
    """Imports of every hand-written module; ``extra`` appends source text to files (``{"nomad/x.py": text}``)."""
    modules = module_names(package_dir)
    known = frozenset(modules)
    out: list[Import] = []
    for module, path in modules.items():
        rel = path.relative_to(package_dir).as_posix()
        if rel.startswith("_proto/"):
            continue
        source = path.read_text() + (extra or {}).get(rel, "")
        out += imports_of(module, source, f"{ROOT}/{rel}", known)
    return out


def violations(imports: Iterable[Import], rules: Iterable[Rule] = RULES) -> list[str]:
    out = []
    for rule in rules:
        layer = _qualified(rule.layer)
        for imp in imports:
            if not _under(imp.source, layer):
                continue
            for forbidden in rule.forbidden:
                if _under(imp.target, _qualified(forbidden)):
                    out.append(
                        f"{imp.where}: {imp.source} imports {imp.target} "
                        f"({rule.layer} must not import {forbidden}: {rule.why})"
                    )
    return sorted(set(out))


def transport_imports(imports: Iterable[Import]) -> list[Import]:
    """Imports of goplugin/ from outside it, but for the entry point, the composition root and the launcher."""
    transport = _qualified(TRANSPORT)
    return [
        imp
        for imp in imports
        if _under(imp.target, transport)
        and not _under(imp.source, transport)
        and not any(_under(imp.source, _qualified(allowed)) for allowed in TRANSPORT_IMPORTERS)
    ]


def _excused(imp: Import) -> tuple[str, str] | None:
    for importer, target in sorted(KNOWN_TRANSPORT_IMPORTS, key=lambda key: key[0] == "*"):  # the named ones first
        if _under(imp.target, _qualified(target)) and (importer == "*" or _under(imp.source, _qualified(importer))):
            return importer, target
    return None


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(edges: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def package_cycles(imports: Iterable[Import]) -> list[frozenset[str]]:
    """Cycles between top-level subpackages (``app``, ``nomad``, ``reconcile``, ...)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if _under(imp.target, ROOT) and not _under(imp.target, f"{ROOT}._proto"):
            src, dst = _top(imp.source), _top(imp.target)
            if src != dst:
                edges[src].add(dst)
    return cycles(edges)


def module_cycles(imports: Iterable[Import]) -> list[frozenset[str]]:
    """Cycles between modules; a module importing its own parent package is not counted."""
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if not _under(imp.target, ROOT) or _under(imp.target, f"{ROOT}._proto"):
            continue
        if imp.target != imp.source and not _under(imp.source, imp.target):
            edges[imp.source].add(imp.target)
    return cycles(edges)


def _report(found: Iterable[frozenset[str]]) -> str:
    return "; ".join(" <-> ".join(sorted(c)) for c in found)


# -- the rules hold on the package ---------------------------------------------------


def test_scan_sees_every_layer_and_lazy_imports():
    imports = all_imports(PACKAGE)
    sources = {imp.source for imp in imports}
    for rule in RULES:
        assert any(_under(s, _qualified(rule.layer)) for s in sources), f"no module found for layer {rule.layer}"
    # app.py imports its engines inside functions; the scan must see those.
    lazy = {imp.target for imp in imports if imp.source == f"{ROOT}.app"}
    assert f"{ROOT}.nomad.reserve" in lazy, "the deferred imports in app.py were not seen"


def test_layers_point_one_way():
    found = violations(all_imports(PACKAGE))
    assert not found, "imports against the one-way rule (docs/architecture.md):\n" + "\n".join(found)


def test_only_the_composition_root_imports_the_transport():
    found = [imp for imp in transport_imports(all_imports(PACKAGE)) if _excused(imp) is None]
    assert not found, (
        f"only {', '.join(TRANSPORT_IMPORTERS)} may import goplugin/ (docs/architecture.md); log with "
        "logging.getLogger(__name__), see the transport through a port:\n"
        + "\n".join(f"{imp.where}: {imp.source} imports {imp.target}" for imp in found)
    )


def test_the_transport_exceptions_are_still_needed():
    used = {_excused(imp) for imp in transport_imports(all_imports(PACKAGE))}
    stale = [
        f"{importer} -> {target}" for importer, target in KNOWN_TRANSPORT_IMPORTS if (importer, target) not in used
    ]
    assert not stale, f"no longer imported: remove from KNOWN_TRANSPORT_IMPORTS: {stale}"


def test_no_cycles_between_subpackages_beyond_the_known_ones():
    found = package_cycles(all_imports(PACKAGE))
    unknown = [c for c in found if c not in KNOWN_CYCLES]
    assert not unknown, f"import cycles between top-level subpackages: {_report(unknown)}"


def test_no_cycles_between_modules_beyond_the_known_ones():
    found = module_cycles(all_imports(PACKAGE))
    unknown = [c for c in found if c not in KNOWN_MODULE_CYCLES]
    assert not unknown, f"import cycles between modules: {_report(unknown)}"


# -- the check cannot be fooled: each removed import, put back, is caught --------------

#: (file, line added, what must then be reported): imports removed to reach the one-way shape.
OLD_IMPORTS = (
    ("goplugin/serve.py", "from nomad_plugin.nomad.services import DeviceService", "goplugin"),
    ("goplugin/serve.py", "from nomad_plugin.app import PluginApp", "goplugin"),
    ("goplugin/handshake.py", "from nomad_plugin.cli.main import MAGIC_COOKIE_KEY", "goplugin"),
    ("nomad/services.py", "from nomad_plugin.app import PluginApp", "nomad"),
    ("jobspec/evaluate.py", "from nomad_plugin.launcher.process import PluginProcess", "jobspec"),
    ("reconcile/reconciler.py", "from nomad_plugin.nomad.reserve import Reserver", "reconcile"),
    ("reconcile/requests.py", "from nomad_plugin.nomad.reserve import Reserver", "reconcile"),
    ("sim/control.py", "from nomad_plugin.sim.simulator import Simulator", "sim.control"),
    ("model/card.py", "import grpc", "model"),
    ("nomad/services.py", "from nomad_plugin.backend_select import accept_config", "nomad"),
    ("nomad/catalog.py", "from nomad_plugin.xdm.adapter import vendor_of", "nomad"),
    ("config/decode.py", "from nomad_plugin.model.errors import PluginError", "config"),
    ("xdm/backend.py", "from nomad_plugin.nomad.reserve import Reserver", "xdm"),
    ("goplugin/serve.py", "from nomad_plugin.config.model import PluginConfig", "goplugin"),
    ("util/text.py", "from nomad_plugin.goplugin.logging import hclog_level", "util"),
    ("util/threads.py", "from nomad_plugin.model.errors import BackendUnavailable", "util"),
)


def _added(line: str, *, inside_function: bool) -> str:
    if inside_function:
        return f"\n\ndef _reintroduced() -> None:\n    {line}\n"
    return f"\n\nfrom typing import TYPE_CHECKING as _TC\n\nif _TC:\n    {line}\n"


@pytest.mark.parametrize("inside_function", [True, False], ids=["in-a-function", "type-checking"])
@pytest.mark.parametrize(("rel", "line", "layer"), OLD_IMPORTS, ids=[f"{r}:{lay}" for r, _, lay in OLD_IMPORTS])
def test_a_reintroduced_import_is_caught(rel, line, layer, inside_function):
    assert (PACKAGE / rel).is_file(), f"{rel} is gone: update OLD_IMPORTS"
    found = violations(all_imports(extra={rel: _added(line, inside_function=inside_function)}))
    assert any(f"({layer} must not import" in v and v.startswith(f"{ROOT}/{rel}:") for v in found), (
        f"putting back {line!r} in {rel} went unnoticed: {found}"
    )


@pytest.mark.parametrize("inside_function", [True, False], ids=["in-a-function", "type-checking"])
@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("nomad/reserve.py", "from nomad_plugin.goplugin.lifecycle import Lifecycle"),
        ("cli/doctor.py", "from nomad_plugin.goplugin.serve import PluginServer"),
        ("reconcile/nomad_api.py", "from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY"),
    ],
)
def test_a_new_importer_of_the_transport_is_caught(rel, line, inside_function):
    found = transport_imports(all_imports(extra={rel: _added(line, inside_function=inside_function)}))
    assert any(imp.where.startswith(f"{ROOT}/{rel}:") and _excused(imp) is None for imp in found), (
        f"putting {line!r} in {rel} went unnoticed"
    )


def test_the_command_tables_string_imports_are_seen():
    imports = all_imports()
    assert any(i.source == f"{ROOT}.cli.main" and i.target == f"{ROOT}.cli.doctor" for i in imports), (
        "cli/main.py's command table names nomad_plugin.cli.doctor, but the scan did not see it"
    )
    back = {"cli/doctor.py": _added("from nomad_plugin.cli.main import SUBCOMMANDS", inside_function=True)}
    found = module_cycles(all_imports(extra=back))
    assert any({f"{ROOT}.cli.main", f"{ROOT}.cli.doctor"} <= c for c in found), (
        f"a command importing back from cli/main.py (loaded by name) went unnoticed: {_report(found)}"
    )


def test_a_reintroduced_cycle_is_caught():
    back = {"nomad/services.py": _added("from nomad_plugin.app import PluginApp", inside_function=True)}
    found = package_cycles(all_imports(extra=back))
    assert any({"app", "nomad"} <= c for c in found), f"app <-> nomad cycle not seen: {_report(found)}"
    back = {"sim/control.py": _added("from nomad_plugin.sim.simulator import Simulator", inside_function=False)}
    found = module_cycles(all_imports(extra=back))
    assert any({f"{ROOT}.sim.control", f"{ROOT}.sim.simulator"} <= c for c in found), (
        f"sim.control <-> sim.simulator not seen: {_report(found)}"
    )
