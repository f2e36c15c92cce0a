# mig-slice.nomad.hcl: a 3-slice MIG instance (3/7 of the compute, 3 x slice_memory GiB).
#
# Shows: MIG through XDM. With `default_mode = "mig"` (plugin-mig.hcl) each MIG-capable
# card is a group "nvidia/gpu-mig/NVIDIA H800 card<minor>" of 7 units; `count` is the
# slice count and must be 1, 2, 3, 4 or 7 (XDM's sizes; `slice_sizes` lists them).
# The constraint asks for units of at least 9 GiB (an 80GB card: floor(79/8) = 9).
# (A `set_contains "3"` on `slice_sizes` would NOT work: Nomad reads the literal
# "3" as the number 3, and set operators compare strings only; check-job says so.)
#
# Dry run:  nomad-device-lingjun check-job examples/jobs/mig-slice.nomad.hcl \
#             --profile h800-8 --plugin-config examples/jobs/plugin-mig.hcl
# check-job: --profile h800-8 --plugin-config examples/jobs/plugin-mig.hcl
job "mig-slice" {
  datacenters = ["*"]
  type        = "batch"

  group "notebook" {
    task "jupyter" {
      driver = "docker"

      config {
        image = "jupyter/pytorch-notebook:latest"
      }

      resources {
        cpu    = 1000
        memory = 4096

        device "nvidia/gpu-mig" {
          count = 3

          constraint {
            attribute = "${device.attr.slice_memory}"
            operator  = ">="
            value     = "9 GiB"
          }
        }
      }
    }
  }
}
