# Wrong: per instance Nomad checks "<pattern> regexp <ID>": each ID is compiled as the pattern, so none matches.
# expect: 0 pass the ${device.ids} constraint one by one
job "bad-ids-regexp" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.ids}"
            operator  = "regexp"
            value     = "^GPU-"
          }
        }
      }
    }
  }
}
