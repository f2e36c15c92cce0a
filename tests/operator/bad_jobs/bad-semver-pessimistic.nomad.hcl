# Wrong: Nomad's semver constraints have no ~> (go-version's version operator has); job validation refuses it.
# expect: Semver constraint is invalid: Malformed constraint: ~> 535.0
# exit: 2 (Nomad refuses the job at submission)
job "bad-semver-pessimistic" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.driver_version}"
            semver    = "~> 535.0"
          }
        }
      }
    }
  }
}
