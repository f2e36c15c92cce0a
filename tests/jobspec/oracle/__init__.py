"""The Go oracle: Go's own answers for the readings in nomad_plugin/jobspec (README.md here)."""
