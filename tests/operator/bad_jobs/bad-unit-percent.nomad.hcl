# Wrong: "80 GB%" is not a number with a unit (the last character is not a letter),
# so Nomad reads it as the string "80 GB%", which never compares with 81559 MiB.
# expect: is not a number with a unit
job "bad-unit-percent" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "80 GB%"
          }
        }
      }
    }
  }
}
