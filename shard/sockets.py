"""Where shard r listens: one naming rule for the launcher that chooses the prefix, the shards
that bind it and the router that connects (torch-free: the router and the launcher import it)."""


def shard_socket(uds_path: str, rank: int) -> str:
    """The Unix socket path of shard `rank` for the `--shard-uds-path` prefix."""
    return f"{uds_path}-{rank}"


def shard_url(uds_path: str, rank: int) -> str:
    """The same socket as a gRPC target."""
    return f"unix://{shard_socket(uds_path, rank)}"
