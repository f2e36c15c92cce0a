# Wrong: a device block is filled from ONE group; the node's single H800 group has 8 cards.
# expect: count 9 larger than the free healthy instances (8
job "bad-count" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
      resources {
        device "nvidia/gpu" {
          count = 9
        }
      }
    }
  }
}
