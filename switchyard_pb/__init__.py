"""Protobuf and gRPC stubs generated from proto/generate.proto (see `switchyard_pb.codegen`)."""
