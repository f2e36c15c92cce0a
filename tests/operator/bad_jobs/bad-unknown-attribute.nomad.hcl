# Wrong: the attribute is called memory (MiB), not memory_gib.
# expect: unknown attribute 'memory_gib'
job "bad-unknown-attribute" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.memory_gib}"
            operator  = ">="
            value     = "40"
          }
        }
      }
    }
  }
}
