# hyper-node-local.nomad.hcl: two 8-card PPU allocations that must sit in the same hyper node.
#
# Shows: `lingjun.hyper_node`, published by the plugin (`node_meta = true`, see
# plugin-node-meta.hcl) from the hyperNode level of XDM's topology, as a group-level
# constraint: both allocations land on nodes of hyper node "hypernode-001", and
# `distinct_hosts` puts them on two nodes. Nodes without the key (no hyper node level, or
# no published meta) are infeasible, never a silent fallback. `set_contains` also matches a
# node that lists several hyper nodes.
# `nomad-device-lingjun topology` shows which nodes publish which keys; the M890P profile
# of the simulator sits in hypernode-001.
#
# Dry run on one node: the device block, and the group-level constraints on the keys the plugin
# publishes with plugin-node-meta.hcl (distinct_hosts and spread need the cluster: shown, not decided):
#   nomad-device-lingjun check-job examples/jobs/hyper-node-local.nomad.hcl --profile m890p-8 \
#     --plugin-config examples/jobs/plugin-node-meta.hcl
# check-job: --profile m890p-8 --plugin-config examples/jobs/plugin-node-meta.hcl
job "hyper-node-local" {
  datacenters = ["*"]
  type        = "batch"

  group "pair" {
    count = 2

    constraint {
      attribute = "${meta.lingjun.hyper_node}"
      operator  = "set_contains"
      value     = "hypernode-001"
    }

    constraint {
      attribute = "${meta.lingjun.card_count}"
      operator  = ">="
      value     = "8"
    }

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    task "allreduce" {
      driver = "docker"

      config {
        image   = "registry.example.com/ppu/nccl-tests:latest"
        command = "all_reduce_perf"
        args    = ["-b", "8", "-e", "4G", "-g", "8"]
      }

      resources {
        cpu    = 16000
        memory = 65536

        device "alibaba/ppu" {
          count = 8

          constraint {
            attribute = "${device.attr.hyper_node}"
            value     = "hypernode-001"
          }
        }
      }
    }
  }
}
