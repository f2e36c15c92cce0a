# Wrong: misspelled keys in the device block; Nomad's HCL decoder refuses the job ("Unsupported argument").
# expect: an argument named "cout" is not expected here. Did you mean "count"?
# exit: 2 (Nomad's decoder refuses the job file)
job "bad-misspelled" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          cout = 2
          constraint {
            atribute = "${device.attr.memory}"
            operater = ">="
            value    = "40 GiB"
          }
        }
      }
    }
  }
}
