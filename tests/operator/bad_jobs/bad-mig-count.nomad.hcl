# Wrong: 5 MIG units is no slice size XDM knows (1, 2, 3, 4, 7); Reserve would refuse it.
# check-job: --set default_mode=mig   (the saved "mig" fingerprint)
# expect: count 5 is no MIG slice size (1, 2, 3, 4, 7)
job "bad-mig-count" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu-mig" {
          count = 5
        }
      }
    }
  }
}
