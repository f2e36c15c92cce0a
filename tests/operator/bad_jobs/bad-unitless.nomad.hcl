# Wrong: memory carries a unit (MiB); a bare number has none, and Nomad refuses to compare them.
# expect: has unit MiB but 80000 has none
job "bad-unitless" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "80000"
          }
        }
      }
    }
  }
}
