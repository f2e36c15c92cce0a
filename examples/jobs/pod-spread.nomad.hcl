# pod-spread.nomad.hcl: a multi-node job spread across points of delivery (pods).
#
# Shows: how to combine device attributes with node-level placement.
# - `spread` (and `constraint`/`affinity` outside a device block) works on NODE
#   attributes and meta only; device attributes are visible only inside a `device`
#   block. So the job-level spread uses the node meta `lingjun.point_of_delivery`,
#   which the plugin publishes from XDM's topology with `node_meta = true`
#   (plugin-node-meta.hcl; docs/topology.md). Where the plugin may not write node
#   metadata, `nomad-device-lingjun node-meta` prints the same keys as a
#   `client { meta = { ... } }` block for the agent configuration.
# - Inside the device block, the `point_of_delivery` device attribute keeps every
#   allocation on cards whose XDM topology says they are in an "a01" pod, so a node
#   whose meta is stale cannot slip in.
# The group's 4 allocations are spread evenly over the pod values (Nomad's spread
# scores nodes; it does not make other pods infeasible). To keep a job inside ONE pod
# instead, see multi-node-training.nomad.hcl.
#
# Dry run on one node: the device block, and the group-level constraints on the keys the plugin
# publishes with plugin-node-meta.hcl (distinct_hosts and spread need the cluster: shown, not decided):
#   nomad-device-lingjun check-job examples/jobs/pod-spread.nomad.hcl --profile h800-8 \
#     --plugin-config examples/jobs/plugin-node-meta.hcl
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-node-meta.hcl
job "pod-spread" {
  datacenters = ["*"]
  type        = "batch"

  spread {
    attribute = "${meta.lingjun.point_of_delivery}"
    weight    = 100
  }

  group "workers" {
    count = 4

    constraint {
      attribute = "${meta.lingjun.point_of_delivery}"
      operator  = "is_set"
    }

    task "worker" {
      driver = "docker"

      config {
        image   = "nvcr.io/nvidia/pytorch:24.01-py3"
        command = "torchrun"
        args    = ["--nnodes", "4", "--nproc-per-node", "8", "train.py"]
      }

      resources {
        cpu    = 16000
        memory = 65536

        device "nvidia/gpu" {
          count = 8

          constraint {
            attribute = "${device.attr.point_of_delivery}"
            operator  = "regexp"
            value     = "^pod-a01-"
          }
        }
      }
    }
  }
}
