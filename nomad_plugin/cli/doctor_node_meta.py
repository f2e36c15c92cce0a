"""``doctor``'s node metadata check (``node_meta = true``): can the plugin publish, and has it?

Read-only: it reads the agent's node metadata (``node:read``), judges from
the token's own policies whether ``POST /v1/client/metadata`` would be
allowed (``node:write``; nothing is written to find out), and reads what the
running plugin last saw (``<data_dir>/node-meta-state.json``): a 403 the
plugin met is reported with the same words it logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from nomad_plugin.config.model import PluginConfig

#: (check, status, summary, next step): doctor turns each into a Finding.
Row = tuple[str, str, str, str]
CHECK = "node meta"


def node_meta_rows(config: PluginConfig, environ: Mapping[str, str]) -> list[Row]:
    from nomad_plugin.journal import plugin_running
    from nomad_plugin.reconcile.node_meta import WRITE_POLICY, load_publisher_state, node_write, state_path
    from nomad_plugin.reconcile.nomad_api import META_PATH, NomadApiError, NomadApiSettings, NomadClient

    if not config.node_meta:
        return [
            (
                CHECK,
                "skip",
                "node_meta = false: the topology is not published as node metadata "
                "(`nomad-device-lingjun node-meta` prints it as a client meta block)",
                "",
            )
        ]
    settings = NomadApiSettings.from_config(config, environ)
    client = NomadClient(settings)
    fix = (
        f"give the token a policy with {WRITE_POLICY} (node:write), or set node_meta = false and put the output "
        "of `nomad-device-lingjun node-meta` in the agent's client { meta { } }"
    )
    try:
        view = client.node_meta()
        allowed, why = node_write(client)
    except NomadApiError as exc:
        step = fix if exc.kind == "forbidden" else f"check nomad_address ({settings.address}) and the TLS options"
        return [(CHECK, "fail", f"{settings.address}{META_PATH}: {exc}", step)]
    finally:
        client.close()
    prefix = config.node_meta_prefix
    published = {k: v for k, v in view.meta.items() if k.startswith(prefix)}
    rows: list[Row] = []
    if not allowed:
        rows.append(
            (
                CHECK,
                "fail",
                f"the Nomad token lacks node:write ({why}): POST {META_PATH} is refused, so the plugin publishes "
                "no topology keys (it keeps serving devices)",
                fix,
            )
        )
    state = None
    try:
        if plugin_running(config.data_dir):
            state = load_publisher_state(state_path(config.data_dir))
    except OSError:
        state = None
    if state is not None and state.last_error:
        rows.append((CHECK, "fail", f"the running plugin could not publish: {state.last_error}", state.hint or fix))
    elif state is not None and state.in_sync:
        stale = {k for k, v in state.wanted.items() if published.get(k) != v}
        if stale:
            rows.append(
                (
                    CHECK,
                    "warn",
                    f"the agent's metadata differs from what the plugin published for {', '.join(sorted(stale))}",
                    "the plugin rewrites them within one inventory_resync_period; if they keep differing, another "
                    f"tool writes under {prefix!r}: give the plugin its own node_meta_prefix",
                )
            )
    if allowed and not any(r[1] == "fail" for r in rows):
        shown = ", ".join(f"{k}={v}" for k, v in sorted(published.items())) or "none yet"
        rows.append(
            (CHECK, "ok", f"the token may write node metadata ({why}); published under {prefix!r}: {shown}", "")
        )
    return rows
