# Nomad agent configuration for the nomad-device-lingjun device plugin.
#
# Put the executable in the agent's plugin_dir as "nomad-device-lingjun" and add this
# block to the client's agent configuration. Every option is shown with its
# default; delete the ones you do not change.
#
# Generated from nomad_plugin/config/options.py by
#   python -m nomad_plugin.config.options plugin.hcl > plugin.hcl
# (do not edit by hand: a test compares this file with the rendering).

plugin "nomad-device-lingjun" {
  config {
    # false: fingerprint no devices and refuse Reserve (as nomad-device-nvidia).
    enabled = true

    # GPU or MIG UUIDs never fingerprinted (as nomad-device-nvidia: a card in MIG mode is hidden by its MIG UUIDs).
    ignored_gpu_ids = []

    # nomad-device-nvidia's key: how often cards are re-read (a Go duration; under 1s means 1s); one setting with inventory_resync_period.
    fingerprint_period = "1m"

    # Where cards come from: auto (XDM if its socket exists, else NVML), xdm or nvml.
    backend = "auto"

    # XDM device-manager socket, an absolute path (ListAndWatch, Allocate, Release, exporter).
    xdm_socket = "/run/amp/eKitC/xdm/sockets/dp2mgr.sock"

    # XDM config-daemon socket (QueryStatus only; the plugin never calls Enable/Disable).
    config_socket = "/run/amp/eKitC/xdm/sockets/config-daemon.sock"

    # Fully-qualified XDM service name; empty = probe the known candidates (see docs/xdm-risks.md, the service name).
    xdm_service = ""

    # How a card minor is sent to Allocate: explicit (field always present) or omit-zero (docs/xdm-risks.md, card 0).
    xdm_minor_encoding = "explicit"

    # Deadline of every unary XDM call but Allocate.
    xdm_call_timeout = "5s"

    # Deadline of XDM Allocate: above its slowest legitimate case (MIG instances on a loaded card take seconds); an Allocate without an answer is kept journalled one more deadline (docs/reserve.md).
    xdm_allocate_timeout = "1m"

    # Env names XDM's grants may set although the Reserve policy protects them (NOMAD_*, PATH, LD_*); see docs/reserve.md.
    xdm_env_allow = []

    # Host paths (and what lies below) XDM's grants may mount read-write or from a protected tree (/etc, /run, /var/lib, ...); see docs/reserve.md.
    xdm_mount_allow = []

    # XDM's proto schema: auto (XDM's server reflection, else the built-in reconstruction), reflection, builtin, or a path to the official .proto file, a directory of .proto files, or a descriptor set (no rebuild).
    xdm_schema = "auto"

    # Extra field matches for the schema binder, { "Message.field" (or "field") of the reconstruction = XDM field name }.
    xdm_field_aliases = []

    # Lowest level the plugin logs; Nomad's agent log_level filters again, so debug and trace lines appear only when the agent logs at that level too.
    log_level = "info"

    # The plugin's own directory for the grant journal: an absolute path, created 0700; an existing one must be owned by the plugin's user and writable by nobody else (never chmodded). The journal is 0600.
    data_dir = "/var/lib/nomad-device-lingjun"

    # Mode of cards no card block matches: whole, tdm (time-division shares) or mig.
    default_mode = "whole"

    # Share instances per card in tdm mode (each 100/N % compute and floor(memory/N) GiB).
    tdm_shares = 10

    # Model substrings that may run in mig mode; XDM's refusal still wins (docs/xdm-risks.md, MIG availability).
    mig_models = ["A100", "A800", "H100", "H800", "H200", "H20", "A30"]

    # Group whole cards by a topology level name (e.g. numaNodes, pcieSwitches) so count=N lands in one domain; none = one group per model.
    group_by = "none"

    # Cards never fingerprinted, by UUID or minor.
    ignored_ids = []

    # Only these vendors (empty = all).
    include_vendors = []

    # Never these vendors.
    exclude_vendors = []

    # Only these device types, e.g. gpu, ppu (empty = all).
    include_types = []

    # Never these device types.
    exclude_types = []

    # Consecutive healthy observations before an unhealthy instance is eligible again.
    health_recovery_checks = 3

    # Or: continuous health for this long makes it eligible again.
    health_recovery_delay = "30s"

    # How often ListGpuInfo re-reads static card data.
    inventory_resync_period = "1m"

    # Pass XDM's host mounts to tasks: auto (unless the task has volume_mounts, which Nomad would drop; asks the Nomad API), always or never. See docs/reserve.md.
    container_mounts = "auto"

    # Release grants whose Nomad allocation ended (needs the Nomad API).
    reconcile = true

    # How long a grant may lack a live allocation before it is released.
    release_grace_period = "30s"

    # Local Nomad agent API URL (http://, https:// or unix://); empty = $NOMAD_ADDR or http://127.0.0.1:4646.
    nomad_address = ""

    # ACL token with node:read, agent:read (unless nomad_node_id is set) and read-job on namespace "*" (docs/reserve.md); empty = nomad_token_file, else $NOMAD_TOKEN. Written here it stands in the agent configuration, which /v1/agent/self shows to every token with agent:read: prefer nomad_token_file or NOMAD_TOKEN.
    nomad_token = ""

    # Absolute path of a file holding the ACL token instead (owned by the plugin's user, mode 0600 or 0400, refused otherwise), read at start and again whenever it changes: a rotated token needs no agent restart.
    nomad_token_file = ""

    # CA bundle for the agent's TLS; empty = $NOMAD_CACERT.
    nomad_ca_cert = ""

    # Client certificate for mTLS; empty = $NOMAD_CLIENT_CERT.
    nomad_client_cert = ""

    # Client key for mTLS; empty = $NOMAD_CLIENT_KEY.
    nomad_client_key = ""

    # TLS server name to verify; empty = $NOMAD_TLS_SERVER_NAME.
    nomad_tls_server_name = ""

    # This node's ID (a UUID; checked with /v1/node/<id>); empty = ask the local agent (/v1/agent/self).
    nomad_node_id = ""

    # Publish XDM's topology and a node summary as Nomad dynamic node metadata (/v1/client/metadata) for job-level constraint/affinity/spread; the token then needs node:write (docs/topology.md).
    node_meta = false

    # Key prefix of the published node metadata (dotted identifiers, ends with a dot); keys outside it are never touched.
    node_meta_prefix = "lingjun."

    # With the XDM backend, fill PCI bus IDs, NUMA nodes and clocks from NVML when it is present.
    nvml_enrich = true

    # Application-level XIDs that do not make a card unhealthy.
    xid_ignore = [13, 31, 43, 45, 68, 109]

    # Prometheus endpoint port; 0 = off.
    metrics_port = 0

    # IP address the Prometheus endpoint binds to ("0.0.0.0" or "::" for every interface), or "localhost".
    metrics_bind = "127.0.0.1"

    # card blocks (repeatable) override the mode of single cards or models.
    # match is a card minor, a card UUID, or an exact model name.
    #
    # card {
    #   match = "NVIDIA A100-SXM4-80GB"
    #   mode  = "mig"
    # }
    # card {
    #   match  = "3"
    #   mode   = "tdm"
    #   shares = 4
    # }
    # card {
    #   match         = "GPU-1b2c3d4e-0000-0000-0000-000000000000"
    #   mode          = "tdm"
    #   share_percent = 25
    # }
    # Card block options:
    #   match (default ""): A card minor, a card UUID, or an exact model name.
    #   mode (default "whole"): whole, tdm or mig.
    #   shares (default 0): tdm: share instances on this card (0 = tdm_shares).
    #   share_percent (default 0): tdm: compute percent per share instead of a count (must divide 100).
  }
}
