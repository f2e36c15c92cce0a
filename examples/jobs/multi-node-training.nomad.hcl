# multi-node-training.nomad.hcl: a 4-node, 32-card training job pinned to one point of delivery
# and spread over its leaf switches.
#
# Shows: XDM's network topology as node metadata. With `node_meta = true` in the plugin's
# config block (plugin-node-meta.hcl) every node publishes `lingjun.point_of_delivery`,
# `lingjun.leaf_switch`, `lingjun.hyper_node`, `lingjun.model`, `lingjun.card_count` and
# `lingjun.runtime_kit` through Nomad's dynamic node metadata API (or the operator pastes
# `nomad-device-lingjun node-meta` into the client's meta). Nomad evaluates job- and
# group-level constraint, affinity and spread on node meta only, so these keys are what
# keeps all allocations of one job in one network domain:
# - the constraint pins every allocation to the point of delivery chosen with
#     nomad-device-lingjun topology --need 32 --model "NVIDIA H800" --per-node 8
#   (it reserves nothing: submit soon after asking);
# - `distinct_hosts` puts one allocation (8 cards) on each node;
# - the spread balances the allocations over the leaf switches of that pod. A node behind
#   two switches publishes both ("asw-001,asw-002"), and Nomad's spread counts that value
#   as one more target;
# - the constraint on `lingjun.runtime_kit` keeps the job off nodes where Runtime Kit is
#   switched off (XDM refuses allocations there).
# Inside the device block, `${device.attr.point_of_delivery}` checks the same pod on the
# cards themselves, so a node whose meta is stale cannot slip in.
#
# Dry run on one node: the device block, and the group-level constraints on the keys the plugin
# publishes with plugin-node-meta.hcl (distinct_hosts and spread need the cluster: shown, not decided):
#   nomad-device-lingjun check-job examples/jobs/multi-node-training.nomad.hcl --profile h800-8 \
#     --plugin-config examples/jobs/plugin-node-meta.hcl
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-node-meta.hcl
job "multi-node-training" {
  datacenters = ["*"]
  type        = "batch"

  group "workers" {
    count = 4

    constraint {
      attribute = "${meta.lingjun.point_of_delivery}"
      value     = "pod-a01-p1"
    }

    constraint {
      attribute = "${meta.lingjun.runtime_kit}"
      value     = "enabled"
    }

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    spread {
      attribute = "${meta.lingjun.leaf_switch}"
      weight    = 100
    }

    task "worker" {
      driver = "docker"

      config {
        image   = "nvcr.io/nvidia/pytorch:24.01-py3"
        command = "torchrun"
        args    = ["--nnodes", "4", "--nproc-per-node", "8", "train.py"]
      }

      resources {
        cpu    = 32000
        memory = 131072

        device "nvidia/gpu" {
          count = 8

          constraint {
            attribute = "${device.attr.point_of_delivery}"
            value     = "pod-a01-p1"
          }
        }
      }
    }
  }
}
