# Plugin config for tdm-share: every card offered as 10 time-division shares
# (each 10 % of the compute and floor(memory_GiB / 10) GiB).
plugin "nomad-device-lingjun" {
  config {
    default_mode = "tdm"
    tdm_shares   = 10
  }
}
