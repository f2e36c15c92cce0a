# Plugin config for two-cards-one-numa and leaf-switch-affinity: whole cards grouped
# per NUMA node, so `count = N` lands inside one NUMA domain by construction.
plugin "nomad-device-lingjun" {
  config {
    group_by = "numaNodes"
  }
}
