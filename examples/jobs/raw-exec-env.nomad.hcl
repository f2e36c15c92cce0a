# raw-exec-env.nomad.hcl: print the environment a task receives from the plugin.
#
# Shows: what Reserve hands the task. raw_exec applies only the environment (no
# device nodes, no mounts), which makes it the quickest way to see the grant:
# LINGJUN_GRANT_ID, LINGJUN_DEVICE_IDS, LINGJUN_DEVICE_MINORS, LINGJUN_MODE,
# LINGJUN_CORE_LIMIT_PERCENT, LINGJUN_MEMORY_LIMIT_GIB, NVIDIA_VISIBLE_DEVICES
# (NVIDIA cards only) and any XDM_* variables mapped from XDM's annotations.
# raw_exec must be enabled on the client: plugin "raw_exec" { config { enabled = true } }.
# `nomad alloc logs <alloc>` shows the output.
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/raw-exec-env.nomad.hcl --profile h800-8
# check-job: --profile h800-8
job "raw-exec-env" {
  datacenters = ["*"]
  type        = "batch"

  group "env" {
    task "print" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "env | grep -E 'LINGJUN|NVIDIA|XDM' | sort"]
      }

      resources {
        cpu    = 50
        memory = 32

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
