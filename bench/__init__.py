"""Benchmarks (not tests): serving against OpenAI/TGI-style servers, and the shards over gRPC."""
