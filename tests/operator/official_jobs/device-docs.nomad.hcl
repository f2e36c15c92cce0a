# The patterns of Nomad's device block documentation (job-specification/device):
# a memory constraint with unit conversion, an affinity, a model set, type-only names.
job "device-docs" {
  group "g" {
    task "memory-constraint" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "2 GiB"
          }

          affinity {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "4 GiB"
            weight    = 75
          }
        }
      }
    }
  }
  group "models" {
    task "t" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.model}"
            operator  = "set_contains_any"
            value     = "NVIDIA H800,NVIDIA H100 80GB HBM3,NVIDIA A100-SXM4-80GB"
          }
        }
      }
    }
  }
  group "type-only" {
    task "t" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "gpu" {}
      }
    }
  }
}
