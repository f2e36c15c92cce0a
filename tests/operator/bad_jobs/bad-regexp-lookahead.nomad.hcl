# Wrong: Go's regexp (RE2) has no look-ahead; Nomad's job validation refuses the pattern.
# expect: Regular expression failed to compile: error parsing regexp: invalid or unsupported Perl syntax
# exit: 2 (Nomad refuses the job at submission)
job "bad-regexp-lookahead" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.model}"
            regexp    = "H(?=800)"
          }
        }
      }
    }
  }
}
