"""Generated protobuf code: never edit by hand."""
