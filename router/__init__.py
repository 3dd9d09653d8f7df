"""Switchyard router: HTTP API, validation, queue, KV block allocation and the batching loop."""

__version__ = "0.1.0"
