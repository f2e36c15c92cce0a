# leaf-switch-affinity.nomad.hcl: prefer cards behind a given leaf (access) switch.
#
# Shows: XDM's network topology levels as device attributes. `leaf_switch`,
# `hyper_node` and `point_of_delivery` are found by level NAME in XDM's topology.
# With `group_by = "numaNodes"` (plugin-numa.hcl) the H800 profile's two NUMA groups
# sit behind different leaf switches (asw-001, asw-002); the affinity makes Nomad's
# device allocator pick the asw-002 group. A constraint instead of an affinity would
# make it a hard requirement (and a node without asw-002 infeasible).
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/leaf-switch-affinity.nomad.hcl \
#             --profile h800-8 --plugin-config examples/jobs/plugin-numa.hcl
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-numa.hcl
job "leaf-switch-affinity" {
  datacenters = ["*"]
  type        = "batch"

  group "allreduce" {
    task "nccl-tests" {
      driver = "docker"

      config {
        image   = "nvcr.io/nvidia/pytorch:24.01-py3"
        command = "all_reduce_perf"
        args    = ["-b", "8", "-e", "1G", "-g", "4"]
      }

      resources {
        cpu    = 4000
        memory = 8192

        device "nvidia/gpu" {
          count = 4

          constraint {
            attribute = "${device.attr.leaf_switch}"
            operator  = "is_set"
          }

          affinity {
            attribute = "${device.attr.leaf_switch}"
            value     = "asw-002"
            weight    = 100
          }
        }
      }
    }
  }
}
