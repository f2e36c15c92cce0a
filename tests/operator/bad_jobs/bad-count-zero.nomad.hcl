# Wrong: count = 0 decodes, but Nomad's allocator refuses a request of zero devices: never placed.
# expect: invalid request of zero devices
job "bad-count-zero" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          count = 0
        }
      }
    }
  }
}
