# Constraints operators commonly write for nomad-device-nvidia: driver version,
# memory in GB, a regexp on the model, a named model, and ${device.ids}.
job "common" {
  group "driver" {
    task "t" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "nvidia/gpu" {
          count = 4
          constraint {
            attribute = "${device.attr.driver_version}"
            operator  = "version"
            value     = ">= 450"
          }
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "40 GB"
          }
          constraint {
            attribute = "${device.model}"
            operator  = "regexp"
            value     = "H[0-9]+"
          }
        }
      }
    }
  }
  group "named" {
    task "t" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "nvidia/gpu/NVIDIA H800" {
          count = 1
          constraint {
            attribute = "${device.ids}"
            operator  = "is_set"
          }
        }
      }
    }
  }
}
