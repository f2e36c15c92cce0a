"""Plain views of what the plugin shows Nomad, and how the Nomad CLI prints them.

A neutral layer: the launcher (the go-plugin client) converts protobuf into
these values; the job-spec evaluator, the operator commands and tests read
them. It imports nothing of the plugin, so both sides can depend on it.
"""
