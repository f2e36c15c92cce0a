# Wrong: is_set is a constraint operator only; Nomad's job validation refuses it in an affinity.
# expect: Affinity 1 validation failed: Unknown affinity operator "is_set"
# exit: 2 (Nomad refuses the job at submission)
job "bad-affinity-is-set" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          affinity {
            attribute = "${device.attr.leaf_switch}"
            operator  = "is_set"
          }
        }
      }
    }
  }
}
