"""Pure domain types that backends produce and the Nomad mapping consumes; no I/O, no generated protobuf."""
