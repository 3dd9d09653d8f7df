"""TCP ports the launcher's children will listen on, checked before anything is spawned.

The router binds `--hostname:--port` only after every shard has loaded its weights; a busy port
used to surface then, as a traceback, a minute into a large model's startup.
"""

from __future__ import annotations

import errno
import socket


class PortUnavailableError(RuntimeError):
    """A port a child will need cannot be bound; the message names the flag."""


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_bindable(
    host: str,
    port: int,
    *,
    flags: tuple[str, str],
    hint: str,
    only_in_use: bool = False,
) -> None:
    """Binds every address `host` resolves to, as asyncio's create_server (aiohttp) will:
    SO_REUSEADDR, so a previous run's TIME_WAIT connections do not count, and IPv6 sockets
    IPv6-only. `flags`: the host's and the port's flag names. `only_in_use`: other errors are
    left for the child to report (e.g. a rendezvous address that is not local)."""
    host_flag, port_flag = flags
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        if only_in_use:
            return
        raise PortUnavailableError(
            f"{host_flag} {host}: cannot resolve it ({exc.strerror})"
        ) from None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                in_use = exc.errno == errno.EADDRINUSE
                if only_in_use and not in_use:
                    continue
                if in_use:
                    why = f"is already in use; {hint}"
                else:
                    why = f"cannot be bound ({exc.strerror}); check {host_flag} and {port_flag}"
                where = _where(address[0], port)
                raise PortUnavailableError(f"{port_flag} {port}: {where} {why}") from None


def check_ports(
    hostname: str, port: int, num_shard: int, master_addr: str, master_port: int
) -> None:
    """Raises PortUnavailableError with one line naming the port and its flag."""
    check_bindable(
        hostname,
        port,
        flags=("--hostname", "--port"),
        hint="stop what listens there or pass another --port",
    )
    if num_shard > 1:  # one shard never joins a torch.distributed rendezvous
        check_bindable(
            master_addr,
            master_port,
            flags=("--master-addr", "--master-port"),
            hint="another multi-shard server may be using it: pass another --master-port",
            only_in_use=True,
        )
