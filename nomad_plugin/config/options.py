"""Every option the plugin accepts, with its HCL type, default and meaning, and what is rendered from it.

The single source of ConfigSchema, the decoder, ``plugin.hcl`` and the README reference
(``python -m nomad_plugin.config.options plugin.hcl | readme``).

ConfigSchema follows Nomad's ``plugins/shared/hclspec``: the root is an ``Object``; each option is
``Default(primary=Attr(name, type), default=Literal(value))`` (hcldec converts both halves with an empty
implied name, so the Attr carries its own); ``Literal.value`` is an HCL expression; ``card`` blocks are a
``BlockList``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from nomad_plugin import PLUGIN_NAME
from nomad_plugin._proto.nomad import hcl_spec_pb2
from nomad_plugin.config.model import CardRule, PluginConfig

DEFAULT_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets"


@dataclass(frozen=True)
class Option:
    name: str
    hcl_type: str  # "string" | "number" | "bool" | "list(string)" | "list(number)" | "list(map(string))"
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    duration: bool = False  # a string holding a Go duration
    secret: bool = False  # never logged or echoed in errors


#: An option whose default is its field's in ``config/model.py``: the default is stated there, once, and
#: rendered here in HCL's form (a list for a tuple, a Go duration for seconds).
MODEL: Any = object()


def _go_duration(seconds: float) -> str:
    whole = int(seconds)
    if whole == seconds and whole and whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole == seconds and whole and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{seconds:g}s"


def _defaults_from(model: type, *options: Option) -> tuple[Option, ...]:
    """``options`` with each ``MODEL`` default replaced by ``model``'s field default in HCL's form."""
    found = {f.name: f.default for f in fields(model) if f.default is not MISSING}
    out = []
    for option in options:
        if option.default is MODEL:
            value = found[option.name]
            hcl = (
                list(value) if isinstance(value, tuple) else _go_duration(value) if isinstance(value, float) else value
            )
            option = replace(option, default=hcl)
        out.append(option)
    return tuple(out)


OPTIONS: tuple[Option, ...] = _defaults_from(
    PluginConfig,
    # --- hashicorp/nomad-device-nvidia's keys, same meaning (drop-in) --------
    Option("enabled", "bool", MODEL, "false: fingerprint no devices and refuse Reserve (as nomad-device-nvidia)."),
    Option(
        "ignored_gpu_ids",
        "list(string)",
        MODEL,
        "GPU or MIG UUIDs never fingerprinted (as nomad-device-nvidia: a card in MIG mode is hidden by its MIG UUIDs).",
    ),
    Option(
        "fingerprint_period",
        "string",
        MODEL,
        "nomad-device-nvidia's key: how often cards are re-read (a Go duration; under 1s means 1s); "
        "one setting with inventory_resync_period.",
    ),
    # --- backend and XDM connection -----------------------------------------
    Option(
        "backend",
        "string",
        MODEL,
        "Where cards come from: auto (XDM if its socket exists, else NVML), xdm or nvml.",
        choices=("auto", "xdm", "nvml"),
    ),
    Option(
        "xdm_socket",
        "string",
        MODEL,
        "XDM device-manager socket, an absolute path (ListAndWatch, Allocate, Release, exporter).",
    ),
    Option(
        "config_socket",
        "string",
        MODEL,
        "XDM config-daemon socket (QueryStatus only; the plugin never calls Enable/Disable).",
    ),
    Option(
        "xdm_service",
        "string",
        MODEL,
        "Fully-qualified XDM service name; empty = probe the known candidates (see docs/xdm-risks.md, the service name).",
    ),
    Option(
        "xdm_minor_encoding",
        "string",
        MODEL,
        "How a card minor is sent to Allocate: explicit (field always present) or omit-zero (docs/xdm-risks.md, card 0).",
        choices=("explicit", "omit-zero"),
    ),
    Option("xdm_call_timeout", "string", MODEL, "Deadline of every unary XDM call but Allocate.", duration=True),
    Option(
        "xdm_allocate_timeout",
        "string",
        MODEL,
        "Deadline of XDM Allocate: above its slowest legitimate case (MIG instances on a loaded card take "
        "seconds); an Allocate without an answer is kept journalled one more deadline (docs/reserve.md).",
        duration=True,
    ),
    Option(
        "xdm_env_allow",
        "list(string)",
        MODEL,
        "Env names XDM's grants may set although the Reserve policy protects them (NOMAD_*, PATH, LD_*); "
        "see docs/reserve.md.",
    ),
    Option(
        "xdm_mount_allow",
        "list(string)",
        MODEL,
        "Host paths (and what lies below) XDM's grants may mount read-write or from a protected tree "
        "(/etc, /run, /var/lib, ...); see docs/reserve.md.",
    ),
    Option(
        "xdm_schema",
        "string",
        MODEL,
        "XDM's proto schema: auto (XDM's server reflection, else the built-in reconstruction), reflection, builtin, "
        "or a path to the official .proto file, a directory of .proto files, or a descriptor set (no rebuild).",
    ),
    Option(
        "xdm_field_aliases",
        "list(map(string))",
        MODEL,
        'Extra field matches for the schema binder, { "Message.field" (or "field") of the reconstruction = XDM field name }.',
    ),
    # --- logging and state ---------------------------------------------------
    Option(
        "log_level",
        "string",
        MODEL,
        "Lowest level the plugin logs; Nomad's agent log_level filters again, so debug and trace lines "
        "appear only when the agent logs at that level too.",
        choices=("trace", "debug", "info", "warn", "error"),
    ),
    Option(
        "data_dir",
        "string",
        MODEL,
        "The plugin's own directory for the grant journal: an absolute path, created 0700; an existing one "
        "must be owned by the plugin's user and writable by nobody else (never chmodded). The journal is 0600.",
    ),
    # --- card modes ----------------------------------------------------------
    Option(
        "default_mode",
        "string",
        MODEL,
        "Mode of cards no card block matches: whole, tdm (time-division shares) or mig.",
        choices=("whole", "tdm", "mig"),
    ),
    Option(
        "tdm_shares",
        "number",
        MODEL,
        "Share instances per card in tdm mode (each 100/N % compute and floor(memory/N) GiB).",
        minimum=1,
        maximum=100,
    ),
    Option(
        "mig_models",
        "list(string)",
        MODEL,
        "Model substrings that may run in mig mode; XDM's refusal still wins (docs/xdm-risks.md, MIG availability).",
    ),
    Option(
        "group_by",
        "string",
        MODEL,
        "Group whole cards by a topology level name (e.g. numaNodes, pcieSwitches) so count=N lands in one domain; none = one group per model.",
    ),
    # --- filters ---------------------------------------------------------------
    Option("ignored_ids", "list(string)", MODEL, "Cards never fingerprinted, by UUID or minor."),
    Option("include_vendors", "list(string)", MODEL, "Only these vendors (empty = all)."),
    Option("exclude_vendors", "list(string)", MODEL, "Never these vendors."),
    Option("include_types", "list(string)", MODEL, "Only these device types, e.g. gpu, ppu (empty = all)."),
    Option("exclude_types", "list(string)", MODEL, "Never these device types."),
    # --- health ----------------------------------------------------------------
    Option(
        "health_recovery_checks",
        "number",
        MODEL,
        "Consecutive healthy observations before an unhealthy instance is eligible again.",
        minimum=1,
        maximum=1000,
    ),
    Option(
        "health_recovery_delay",
        "string",
        MODEL,
        "Or: continuous health for this long makes it eligible again.",
        duration=True,
    ),
    Option(
        "inventory_resync_period", "string", MODEL, "How often ListGpuInfo re-reads static card data.", duration=True
    ),
    Option(
        "container_mounts",
        "string",
        MODEL,
        "Pass XDM's host mounts to tasks: auto (unless the task has volume_mounts, which Nomad would drop; "
        "asks the Nomad API), always or never. See docs/reserve.md.",
        choices=("auto", "always", "never"),
    ),
    # --- release lifecycle -------------------------------------------------------
    Option("reconcile", "bool", MODEL, "Release grants whose Nomad allocation ended (needs the Nomad API)."),
    Option(
        "release_grace_period",
        "string",
        MODEL,
        "How long a grant may lack a live allocation before it is released.",
        duration=True,
    ),
    Option(
        "nomad_address",
        "string",
        MODEL,
        "Local Nomad agent API URL (http://, https:// or unix://); empty = $NOMAD_ADDR or http://127.0.0.1:4646.",
    ),
    Option(
        "nomad_token",
        "string",
        MODEL,
        'ACL token with node:read, agent:read (unless nomad_node_id is set) and read-job on namespace "*" (docs/reserve.md); '
        "empty = nomad_token_file, else $NOMAD_TOKEN. Written here it stands in the agent configuration, which "
        "/v1/agent/self shows to every token with agent:read: prefer nomad_token_file or NOMAD_TOKEN.",
        secret=True,
    ),
    Option(
        "nomad_token_file",
        "string",
        MODEL,
        "Absolute path of a file holding the ACL token instead (owned by the plugin's user, mode 0600 or 0400, "
        "refused otherwise), read at start and again whenever it changes: a rotated token needs no agent restart.",
    ),
    Option("nomad_ca_cert", "string", MODEL, "CA bundle for the agent's TLS; empty = $NOMAD_CACERT."),
    Option("nomad_client_cert", "string", MODEL, "Client certificate for mTLS; empty = $NOMAD_CLIENT_CERT."),
    Option("nomad_client_key", "string", MODEL, "Client key for mTLS; empty = $NOMAD_CLIENT_KEY."),
    Option("nomad_tls_server_name", "string", MODEL, "TLS server name to verify; empty = $NOMAD_TLS_SERVER_NAME."),
    Option(
        "nomad_node_id",
        "string",
        MODEL,
        "This node's ID (a UUID; checked with /v1/node/<id>); empty = ask the local agent (/v1/agent/self).",
    ),
    # --- node metadata (XDM topology for job-level constraints) --------------------
    Option(
        "node_meta",
        "bool",
        MODEL,
        "Publish XDM's topology and a node summary as Nomad dynamic node metadata (/v1/client/metadata) for "
        "job-level constraint/affinity/spread; the token then needs node:write (docs/topology.md).",
    ),
    Option(
        "node_meta_prefix",
        "string",
        MODEL,
        "Key prefix of the published node metadata (dotted identifiers, ends with a dot); keys outside it are "
        "never touched.",
    ),
    # --- NVML ----------------------------------------------------------------
    Option(
        "nvml_enrich",
        "bool",
        MODEL,
        "With the XDM backend, fill PCI bus IDs, NUMA nodes and clocks from NVML when it is present.",
    ),
    Option(
        "xid_ignore",
        "list(number)",
        MODEL,
        "Application-level XIDs that do not make a card unhealthy.",
    ),
    # --- Prometheus ----------------------------------------------------------------
    Option("metrics_port", "number", MODEL, "Prometheus endpoint port; 0 = off.", minimum=0, maximum=65535),
    Option(
        "metrics_bind",
        "string",
        MODEL,
        'IP address the Prometheus endpoint binds to ("0.0.0.0" or "::" for every interface), or "localhost".',
    ),
)

# ``card`` blocks (repeatable): per-card or per-model mode overrides (CARD_EXAMPLE below).
CARD_BLOCK = "card"
CARD_OPTIONS: tuple[Option, ...] = _defaults_from(
    CardRule,
    Option("match", "string", "", "A card minor, a card UUID, or an exact model name."),
    Option("mode", "string", MODEL, "whole, tdm or mig.", choices=("whole", "tdm", "mig")),
    Option("shares", "number", MODEL, "tdm: share instances on this card (0 = tdm_shares).", minimum=0, maximum=100),
    Option(
        "share_percent",
        "number",
        MODEL,
        "tdm: compute percent per share instead of a count (must divide 100).",
        minimum=0,
        maximum=100,
    ),
)


def option(name: str) -> Option:
    return {opt.name: opt for opt in OPTIONS}[name]


# --- ConfigSchema --------------------------------------------------------------------------

#: The escapes HCL knows; every other control character as \\u.
_ESCAPES = {code: f"\\u{code:04x}" for code in (*range(0x20), 0x7F)} | {
    ord('"'): '\\"',
    ord("\\"): "\\\\",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def hcl_string(text: str) -> str:
    """A quoted HCL string literal; "${" and "%{" would start template sequences, so they are doubled."""
    return '"' + text.translate(_ESCAPES).replace("${", "$${").replace("%{", "%%{") + '"'


def hcl_literal(value: Any) -> str:
    """An HCL expression for a default value: a string, int, bool, or a list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(hcl_literal(v) for v in value) + "]"
    raise TypeError(f"no HCL literal for {type(value).__name__} {value!r}")


def option_spec(opt: Option) -> hcl_spec_pb2.Spec:
    return hcl_spec_pb2.Spec(
        default=hcl_spec_pb2.Default(
            primary=hcl_spec_pb2.Spec(Attr=hcl_spec_pb2.Attr(name=opt.name, type=opt.hcl_type)),
            default=hcl_spec_pb2.Spec(literal=hcl_spec_pb2.Literal(value=hcl_literal(opt.default))),
        )
    )


def object_spec(options: tuple[Option, ...]) -> hcl_spec_pb2.Spec:
    return hcl_spec_pb2.Spec(object=hcl_spec_pb2.Object(attributes={opt.name: option_spec(opt) for opt in options}))


def config_spec() -> hcl_spec_pb2.Spec:
    """The root spec ConfigSchema returns."""
    root = object_spec(OPTIONS)
    root.object.attributes[CARD_BLOCK].CopyFrom(
        hcl_spec_pb2.Spec(block_list=hcl_spec_pb2.BlockList(name=CARD_BLOCK, nested=object_spec(CARD_OPTIONS)))
    )
    return root


# --- the README reference -------------------------------------------------------------------

README_START = "<!-- config-reference:start (generated by `python -m nomad_plugin.config.options readme`) -->"
README_END = "<!-- config-reference:end -->"


def _readme_kind(opt: Option) -> str:
    if opt.duration:
        return "duration"
    if opt.choices:
        return " \\| ".join(f"`{c}`" for c in opt.choices)
    return opt.hcl_type


def _readme_rows(options: tuple[Option, ...], prefix: str = "") -> list[str]:
    pipe = "\\|"
    return [
        f"| `{prefix}{o.name}` | {_readme_kind(o)} | `{json.dumps(o.default)}` | {o.doc.replace('|', pipe)} |"
        for o in options
    ]


def readme_table() -> str:
    lines = [
        README_START,
        "| option | type | default | what it does |",
        "|---|---|---|---|",
        *_readme_rows(OPTIONS),
        *_readme_rows(CARD_OPTIONS, prefix=f"{CARD_BLOCK} {{ … }}."),
        README_END,
    ]
    return "\n".join(lines)


def splice_readme(text: str) -> str:
    """``text`` (the README) with the block between the markers replaced by ``readme_table()``."""
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    return text[:start] + readme_table() + text[end:]


# --- plugin.hcl --------------------------------------------------------------------------------

PLUGIN_HCL_HEADER = f"""\
# Nomad agent configuration for the {PLUGIN_NAME} device plugin.
#
# Put the executable in the agent's plugin_dir as "{PLUGIN_NAME}" and add this
# block to the client's agent configuration. Every option is shown with its
# default; delete the ones you do not change.
#
# Generated from nomad_plugin/config/options.py by
#   python -m nomad_plugin.config.options plugin.hcl > plugin.hcl
# (do not edit by hand: a test compares this file with the rendering).
"""

CARD_EXAMPLE = f"""\
    # {CARD_BLOCK} blocks (repeatable) override the mode of single cards or models.
    # match is a card minor, a card UUID, or an exact model name.
    #
    # {CARD_BLOCK} {{
    #   match = "NVIDIA A100-SXM4-80GB"
    #   mode  = "mig"
    # }}
    # {CARD_BLOCK} {{
    #   match  = "3"
    #   mode   = "tdm"
    #   shares = 4
    # }}
    # {CARD_BLOCK} {{
    #   match         = "GPU-1b2c3d4e-0000-0000-0000-000000000000"
    #   mode          = "tdm"
    #   share_percent = 25
    # }}
"""


def plugin_hcl() -> str:
    options = "\n\n".join(f"    # {opt.doc}\n    {opt.name} = {hcl_literal(opt.default)}" for opt in OPTIONS)
    cards = "".join(f"    #   {opt.name} (default {hcl_literal(opt.default)}): {opt.doc}\n" for opt in CARD_OPTIONS)
    body = f"{options}\n\n{CARD_EXAMPLE}    # Card block options:\n{cards}"
    return f'{PLUGIN_HCL_HEADER}\nplugin "{PLUGIN_NAME}" {{\n  config {{\n{body}  }}\n}}\n'


def main(argv: list[str] | None = None) -> int:
    """``plugin.hcl`` prints the agent block; ``readme`` the README table (``readme --write FILE`` splices it in)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["plugin.hcl"]:
        sys.stdout.write(plugin_hcl())
        return 0
    if args[:2] == ["readme", "--write"] and len(args) == 3:
        path = Path(args[2])
        path.write_text(splice_readme(path.read_text()))
        return 0
    if args == ["readme"]:
        print(readme_table())
        return 0
    sys.stderr.write("usage: python -m nomad_plugin.config.options plugin.hcl | readme [--write README.md]\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
