"""HashiCorp go-plugin server side: handshake, gRPC server, hclog logging."""
