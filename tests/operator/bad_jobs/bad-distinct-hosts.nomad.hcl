# Wrong: distinct_hosts is a job/group constraint; Nomad rejects it inside a device block.
# expect: distinct_hosts is not allowed inside a device block
job "bad-distinct-hosts" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            operator = "distinct_hosts"
          }
        }
      }
    }
  }
}
