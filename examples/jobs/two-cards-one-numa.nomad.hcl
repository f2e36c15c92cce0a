# two-cards-one-numa.nomad.hcl: two whole cards on the same NUMA node.
#
# Shows: with `group_by = "numaNodes"` in the plugin config (plugin-numa.hcl) the
# plugin emits one device group per NUMA node ("nvidia/gpu/NVIDIA H800 numa0",
# "... numa1"). Nomad fills one `device` block from ONE group, so both cards come
# from the same NUMA node by construction. The affinity prefers NUMA node 0 via
# the group attribute `topology.numaNodes` (an int: the literal "0" compares).
# Use `device "nvidia/gpu"` plus a constraint on `${device.attr.model}` rather than
# `device "nvidia/gpu/NVIDIA H800"`: the group name carries the domain suffix.
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/two-cards-one-numa.nomad.hcl \
#             --profile h800-8 --plugin-config examples/jobs/plugin-numa.hcl
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-numa.hcl
job "two-cards-one-numa" {
  datacenters = ["*"]
  type        = "batch"

  group "train" {
    task "torchrun" {
      driver = "docker"

      config {
        image   = "nvcr.io/nvidia/pytorch:24.01-py3"
        command = "python"
        args    = ["-c", "import torch; print(torch.cuda.device_count())"]
      }

      resources {
        cpu    = 4000
        memory = 16384

        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.attr.model}"
            value     = "NVIDIA H800"
          }

          affinity {
            attribute = "${device.attr.topology.numaNodes}"
            value     = "0"
            weight    = 50
          }
        }
      }
    }
  }
}
