# Enable the client
client {
  enabled = true
  options = {
    driver.java.enable = "1"
    docker.cleanup.image = false
  }
}