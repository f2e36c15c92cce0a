# Wrong (plugin config: default_mode = "mig"): Nomad reads the literal "3" as the number 3
# and set operators compare strings only.
# expect: set_contains compares strings only
# check-job: --set default_mode=mig
job "bad-set-contains-number" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu-mig" {
          count = 3
          constraint {
            attribute = "${device.attr.slice_sizes}"
            operator  = "set_contains"
            value     = "3"
          }
        }
      }
    }
  }
}
