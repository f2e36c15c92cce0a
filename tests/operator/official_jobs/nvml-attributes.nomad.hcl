# Constraints on the attributes nomad-device-nvidia reads from NVML, with its units:
# bar1 (MiB), power (W), cores_clock / memory_clock (MHz), pci_bandwidth (MB/s),
# persistence_mode / display_state (strings "1" / "0"). Nomad reads a literal "1" as a
# number and never compares a number with a string, so on either plugin the two modes
# can only be tested with is_set / is_not_set (in a constraint: Nomad refuses them in an
# affinity).
job "nvml-attributes" {
  group "g" {
    task "t" {
      driver = "docker"
      config { image = "x" }
      resources {
        device "nvidia/gpu" {
          count = 1
          constraint {
            attribute = "${device.attr.bar1}"
            operator  = ">="
            value     = "256 MiB"
          }
          constraint {
            attribute = "${device.attr.cores_clock}"
            operator  = ">="
            value     = "1 GHz"
          }
          constraint {
            attribute = "${device.attr.memory_clock}"
            operator  = ">="
            value     = "1000 MHz"
          }
          constraint {
            attribute = "${device.attr.pci_bandwidth}"
            operator  = ">="
            value     = "15 GB/s"
          }
          constraint {
            attribute = "${device.attr.power}"
            operator  = ">="
            value     = "0 W"
          }
          constraint {
            attribute = "${device.attr.persistence_mode}"
            operator  = "is_set"
          }
          constraint {
            attribute = "${device.attr.display_state}"
            operator  = "is_set"
          }
        }
      }
    }
  }
}
