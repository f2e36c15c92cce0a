job "ml-workload" {
  datacenters = ["dc1"]

  group "gpu" {
    task "training" {
      driver = "ch"


      config {
        image = "/var/lib/images/cuda-ubuntu.img"
        hostname = "ml-trainer"

        # VFIO GPU passthrough (not yet implemented)
        # vfio_devices = ["10de:2204"]  # NVIDIA RTX 3080
      }

      resources {
        cpu      = 8000  # 8 CPU cores
        memory   = 16384 # 16GB RAM
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
