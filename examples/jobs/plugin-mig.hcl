# Plugin config for mig-slice: every MIG-capable card offered as 7 MIG units
# (1/7 of the compute, floor(memory_GiB / 8) GiB each).
plugin "nomad-device-lingjun" {
  config {
    default_mode = "mig"
  }
}
