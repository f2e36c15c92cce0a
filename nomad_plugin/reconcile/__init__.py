"""Releasing grants whose Nomad allocation ended, by watching the local agent's API."""
