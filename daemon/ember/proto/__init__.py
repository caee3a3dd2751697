"""Generated protobuf modules (see Makefile target proto)."""
