"""HTTP handlers, one module per API surface (generate, stream, info/health/tokenize)."""
