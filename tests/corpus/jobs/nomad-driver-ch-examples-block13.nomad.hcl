job "ml-cluster" {
  datacenters = ["dc1"]
  type = "service"

  constraint {
    attribute = "${node.class}"
    value     = "gpu-cluster"
  }

  # Parameter server
  group "ps" {
    task "parameter-server" {
      driver = "virt"

      config {
        image = "/var/lib/images/tensorflow-distributed.img"
        hostname = "ml-ps"

        network_interface {
          bridge {
            name = "br0"
            static_ip = "192.168.1.100"
            ports = ["ps"]
          }
        }

        user_data = <<EOF
#cloud-config
packages:
  - python3
  - python3-pip

runcmd:
  - pip3 install tensorflow numpy
  - python3 -c "
import tensorflow as tf
import json

cluster = {
    'worker': ['192.168.1.101:2222', '192.168.1.102:2222'],
    'ps': ['192.168.1.100:2222']
}

server = tf.distribute.Server(
    tf.train.ClusterSpec(cluster),
    job_name='ps',
    task_index=0
)

print('Parameter server started')
server.join()
"
EOF
      }

      resources {
        cpu    = 2000
        memory = 4096
      }
    }

    network {
      port "ps" {
        static = 2222
        to     = 2222
      }
    }

    service {
      name = "ml-parameter-server"
      port = "ps"
      tags = ["ml", "parameter-server", "distributed"]
    }
  }

  # Worker nodes with GPUs
  group "workers" {
    count = 2

    task "worker" {
      driver = "virt"

      config {
        image = "/var/lib/images/tensorflow-gpu.img"
        hostname = "ml-worker-${NOMAD_ALLOC_INDEX}"

        # GPU passthrough
        vfio_devices = ["10de:2204"]  # NVIDIA RTX 3080

        network_interface {
          bridge {
            name = "br0"
            static_ip = "192.168.1.${101 + NOMAD_ALLOC_INDEX}"
            ports = ["worker"]
          }
        }

        user_data = <<EOF
#cloud-config
packages:
  - python3
  - python3-pip
  - nvidia-driver-470

runcmd:
  - pip3 install tensorflow-gpu numpy
  - python3 -c "
import tensorflow as tf
import os

cluster = {
    'worker': ['192.168.1.101:2222', '192.168.1.102:2222'],
    'ps': ['192.168.1.100:2222']
}

task_index = int(os.environ.get('NOMAD_ALLOC_INDEX', 0))

server = tf.distribute.Server(
    tf.train.ClusterSpec(cluster),
    job_name='worker',
    task_index=task_index
)

print(f'Worker {task_index} started with GPU')
server.join()
"
EOF
      }

      resources {
        cpu    = 4000
        memory = 8192
        device "nvidia/gpu" {
          count = 1
        }
      }
    }

    network {
      port "worker" {
        to = 2222
      }
    }

    service {
      name = "ml-worker"
      port = "worker"
      tags = ["ml", "worker", "gpu", "distributed"]
    }
  }
}
