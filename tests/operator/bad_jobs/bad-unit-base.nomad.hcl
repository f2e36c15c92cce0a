# Wrong: memory is in bytes (MiB); MHz is a frequency. Units of different bases never compare.
# expect: unit mismatch: MiB (bytes) cannot compare with MHz (hertz)
job "bad-unit-base" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "1000 MHz"
          }
        }
      }
    }
  }
}
