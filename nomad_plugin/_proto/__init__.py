"""Generated protobuf code: never edit by hand (see tools/gen_protos.py)."""
