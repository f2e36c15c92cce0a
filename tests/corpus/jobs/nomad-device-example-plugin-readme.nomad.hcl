job "job" {
  group "grp" {
    task "tsk" {
      driver = "..."
      config {}
      resources {
        device "nomad/file/mock" {
          count = 1
        }
      }
    }
  }
}
