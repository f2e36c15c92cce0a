# tdm-share.nomad.hcl: three time-division shares of ONE card (30 % compute, 3 x 7 GiB).
#
# Shows: fractional GPUs as ordinary Nomad instances. With `default_mode = "tdm"`
# (plugin-tdm.hcl) each card is its own group "nvidia/gpu-share/NVIDIA H800 card<minor>"
# of 10 shares; `count = 3` buys 3 shares of one card, never 2 + 1 on two cards.
# XDM enforces the limits; the task sees LINGJUN_CORE_LIMIT_PERCENT=30 and
# LINGJUN_MEMORY_LIMIT_GIB=21. `share_memory` is per share, in GiB.
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/tdm-share.nomad.hcl \
#             --profile h800-8 --plugin-config examples/jobs/plugin-tdm.hcl
#   (or: --set default_mode=tdm instead of the plugin config file)
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-tdm.hcl
job "tdm-share" {
  datacenters = ["*"]
  type        = "service"

  group "inference" {
    count = 3

    task "server" {
      driver = "docker"

      config {
        image = "vllm/vllm-openai:latest"
        args  = ["--model", "Qwen/Qwen2-7B-Instruct", "--gpu-memory-utilization", "0.9"]
      }

      resources {
        cpu    = 2000
        memory = 8192

        device "nvidia/gpu-share" {
          count = 3

          constraint {
            attribute = "${device.attr.share_memory}"
            operator  = ">="
            value     = "7 GiB"
          }
        }
      }
    }
  }
}
