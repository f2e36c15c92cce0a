# Wrong: the group name is the full model name "NVIDIA H800", not "H800".
# expect: name mismatch: model 'H800' != 'NVIDIA H800'
job "bad-name" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu/H800" {}
      }
    }
  }
}
