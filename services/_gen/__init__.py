"""Generated protobuf and gRPC code (see tools/gen_protos.py)."""
