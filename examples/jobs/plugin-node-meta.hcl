# plugin-node-meta.hcl: publish XDM's topology as Nomad node metadata.
#
# With node_meta = true the plugin writes lingjun.* keys through the local agent's
# /v1/client/metadata (Nomad >= 1.5), so job- and group-level constraint, affinity and
# spread can use ${meta.lingjun.point_of_delivery}, ${meta.lingjun.leaf_switch},
# ${meta.lingjun.hyper_node}, ... (docs/topology.md). The token then needs node:write
# besides the reconciler's rights:
#   node      { policy = "write" }
#   agent     { policy = "read" }
#   namespace "*" { capabilities = ["read-job"] }
# Without that capability the plugin logs it once and keeps serving; doctor says so too.
plugin "nomad-device-lingjun" {
  config {
    node_meta = true
  }
}
