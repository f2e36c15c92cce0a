"""The plugin never calls Enable or Disable (R14): only the operator's ``runtime-kit`` command can.

Statically: ``xdm/runtime_switch.py`` (the one module that binds Enable and
Disable) is imported by ``cli/runtime_kit.py`` alone, wherever an import
stands (top, in a function, under TYPE_CHECKING); the plugin's RPC table and
its XDM client hold neither. The dynamic proof is
tests/topology/test_runtime_kit_e2e.py::test_the_plugin_never_calls_enable_or_disable
(the simulator counts every RPC a whole plugin session sends).
"""

from __future__ import annotations

from nomad_plugin.xdm import binder
from nomad_plugin.xdm.client import XdmClient
from tests.hardening.test_layers import ROOT, _added, all_imports

SWITCH = f"{ROOT}.xdm.runtime_switch"
ALLOWED = {f"{ROOT}.cli.runtime_kit"}


def importers(extra: dict[str, str] | None = None) -> set[str]:
    return {imp.source for imp in all_imports(extra=extra) if imp.target == SWITCH} - {SWITCH}


def test_only_the_runtime_kit_command_imports_the_switch() -> None:
    assert importers() == ALLOWED


def test_a_plugin_module_importing_the_switch_is_caught() -> None:
    for rel in ("app.py", "xdm/backend.py", "nomad/services.py", "cli/main.py"):
        for inside in (True, False):
            line = "from nomad_plugin.xdm.runtime_switch import RuntimeKitSwitch"
            found = importers({rel: _added(line, inside_function=inside)})
            assert found - ALLOWED, f"{rel}: an import of the switch went unnoticed"


def test_the_plugins_rpc_table_and_client_hold_no_switch() -> None:
    assert not {"Enable", "Disable"} & {method for method, _, _ in binder.RPCS}
    assert not {"enable", "disable", "switch"} & {name.lower() for name in dir(XdmClient)}
    assert {"Enable", "Disable"} <= {method for method, _, _ in binder.SWITCH_RPCS}
