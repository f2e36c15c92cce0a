# Wrong: a constraint's set_contains_any key is dropped by Nomad's decoder (only affinities have it),
# leaving operator = with no value, which job validation refuses.
# expect: Operator "=" requires an RTarget
# exit: 2 (Nomad refuses the job at submission)
job "bad-set-contains-any-key" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute        = "${device.model}"
            set_contains_any = "NVIDIA H800,NVIDIA H20"
          }
        }
      }
    }
  }
}
