# whole-card.nomad.hcl: one whole GPU, written exactly as for HashiCorp's NVIDIA plugin.
#
# Shows: the plugin is a drop-in for jobs written for nomad-device-nvidia: same
# vendor/type ("nvidia/gpu"), same `memory` attribute in MiB, constraints in GiB
# (Nomad converts units). An "80GB" H800 reports 81559 MiB = 79.6 GiB, so the
# constraint says ">= 79 GiB"; ">= 80 GiB" would reject it (check-job shows why).
# The docker driver sees NVIDIA_VISIBLE_DEVICES and selects the nvidia runtime.
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/whole-card.nomad.hcl --profile h800-8
# check-job: --profile h800-8
job "whole-card" {
  datacenters = ["*"]
  type        = "batch"

  group "smi" {
    task "nvidia-smi" {
      driver = "docker"

      config {
        image   = "nvidia/cuda:12.2.0-base-ubuntu22.04"
        command = "nvidia-smi"
      }

      resources {
        cpu    = 200
        memory = 256

        device "nvidia/gpu" {
          count = 1

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "79 GiB"
          }
        }
      }
    }
  }
}
