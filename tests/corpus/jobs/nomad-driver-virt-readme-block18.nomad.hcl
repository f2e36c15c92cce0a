job "ai-training" {
  datacenters = ["dc1"]

  constraint {
    attribute = "${node.unique.name}"
    value     = "gpu-node-1"
  }

  group "training" {
    task "model-training" {
      driver = "nomad-driver-ch"

      config {
        image = "/var/lib/images/cuda-pytorch.img"

        # Pass through NVIDIA RTX 3080 (not yet implemented)
        # vfio_devices = ["10de:2204", "10de:1aef"]  # GPU + Audio controller
      }

      resources {
        cpu    = 8000
        memory = 32768
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
