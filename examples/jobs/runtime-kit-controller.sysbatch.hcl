# runtime-kit-controller.sysbatch.hcl: switch Runtime Kit on the nodes whose meta asks for it, off-peak.
#
# Nomad's counterpart of the Runtime Kit Controller and its Job Agent on Kubernetes, which
# enable Runtime Kit on nodes labelled lj_runtimekit_enable=true. Here the node meta
# `lj_runtimekit_enable` is the switch:
#   nomad node meta apply -node-id <node> lj_runtimekit_enable=true    (then this job enables it)
#   nomad node meta apply -node-id <node> lj_runtimekit_enable=false   (then this job disables it)
# A node without the key is left alone: an unset key never disables anything (Kubernetes'
# Controller disables when the label is removed; a forgotten key must not switch a whole
# cluster off).
#
# It runs `nomad-device-lingjun runtime-kit enable|disable --yes` once per matching node
# (a sysbatch job), at 03:00 local time: Runtime Kit's own guide advises switching
# features and upgrading off-peak. Run it at once with `nomad job periodic force
# runtime-kit-controller`. Each run changes nothing where the status already matches (the
# command reads QueryStatus first); `disable` refuses while the plugin holds grants on the
# node, so drain the node's device jobs first (`nomad node drain -enable <node>`). Roll out
# a few nodes at a time: set the meta on some nodes, force a run, check
# `nomad-device-lingjun topology` and the nodes' `lingjun.runtime_kit` meta, then go on
# (docs/operator.md, "Switching Runtime Kit").
#
# Needs: the raw_exec driver enabled on the clients (the command talks to XDM's root-only
# config-daemon socket), and the plugin executable at the path below (the agent's
# plugin_dir). The plugin itself never calls Enable or Disable.
#
# Dry run (which group a node whose meta asks for Runtime Kit runs: "enable" places, "disable"
# does not; a sysbatch job runs each group where its rules hold, so check-job exits 0; with =false it
# is the other way round):
#           nomad-device-lingjun check-job examples/jobs/runtime-kit-controller.sysbatch.hcl \
#             --profile h800-8 --node-value meta.lj_runtimekit_enable=true
# check-job: --profile h800-8 --node-value meta.lj_runtimekit_enable=true
job "runtime-kit-controller" {
  datacenters = ["*"]
  type        = "sysbatch"
  priority    = 80

  periodic {
    crons            = ["0 3 * * *"]
    time_zone        = "Asia/Shanghai"
    prohibit_overlap = true
  }

  group "enable" {
    constraint {
      attribute = "${meta.lj_runtimekit_enable}"
      value     = "true"
    }

    task "runtime-kit-enable" {
      driver = "raw_exec"

      config {
        command = "/opt/nomad/plugins/nomad-device-lingjun"
        args    = ["runtime-kit", "enable", "--yes", "--plugin-config", "/etc/nomad.d"]
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }

  group "disable" {
    constraint {
      attribute = "${meta.lj_runtimekit_enable}"
      value     = "false"
    }

    task "runtime-kit-disable" {
      driver = "raw_exec"

      config {
        command = "/opt/nomad/plugins/nomad-device-lingjun"
        args    = ["runtime-kit", "disable", "--yes", "--plugin-config", "/etc/nomad.d"]
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
