# Wrong: distinct_hosts is a job/group constraint; Nomad rejects it inside a device block.
# expect: Constraint 1 validation failed: using unsupported operand "distinct_hosts"
# exit: 2 (Nomad refuses the job at submission)
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
