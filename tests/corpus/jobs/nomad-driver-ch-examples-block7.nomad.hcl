job "tensorflow-training" {
  datacenters = ["dc1"]
  type = "batch"

  constraint {
    attribute = "${node.class}"
    value     = "gpu"
  }

  group "training" {
    task "train-model" {
      driver = "virt"

      config {
        image = "/var/lib/images/tensorflow-gpu.img"
        hostname = "tf-trainer"

        # GPU passthrough
        vfio_devices = ["10de:2204"]  # NVIDIA RTX 3080

        user_data = <<EOF
#cloud-config
packages:
  - python3
  - python3-pip
  - nvidia-driver-470
  - nvidia-utils-470

write_files:
  - path: /app/train.py
    content: |
      import tensorflow as tf
      import numpy as np
      import os

      print("TensorFlow version:", tf.__version__)
      print("GPU Available: ", tf.config.list_physical_devices('GPU'))

      # Simple model training example
      mnist = tf.keras.datasets.mnist
      (x_train, y_train), (x_test, y_test) = mnist.load_data()
      x_train, x_test = x_train / 255.0, x_test / 255.0

      model = tf.keras.models.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(10)
      ])

      model.compile(optimizer='adam',
                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=['accuracy'])

      model.fit(x_train, y_train, epochs=5, validation_data=(x_test, y_test))
      model.save('/alloc/data/trained_model')
      print("Training complete! Model saved.")
    permissions: '0755'

runcmd:
  - mkdir -p /app
  - pip3 install tensorflow-gpu numpy
  - cd /app && python3 train.py
EOF
      }

      resources {
        cpu    = 4000
        memory = 8192
        device "nvidia/gpu" {
          count = 1
        }
      }

      # Mount for saving trained models
      volume_mount {
        volume      = "model-output"
        destination = "/alloc/data"
        read_only   = false
      }
    }
  }

  volume "model-output" {
    type      = "host"
    source    = "ml-models"
    read_only = false
  }
}
