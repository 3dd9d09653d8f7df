"""The shards' unix sockets: a private default location per launcher, and never removing a socket
that another server is still listening on.

A fixed default path (TGI's `/tmp/text-generation-server`) makes two servers on one host share
sockets: the second one removed the first one's live socket as "stale" and took its place.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("launcher")

FLAG = "--shard-uds-path"
# sun_path holds 108 bytes on Linux, the terminating NUL included; a longer path cannot be bound.
MAX_SOCKET_PATH_BYTES = 107
# A listener too busy to accept within this is still a listener.
PROBE_TIMEOUT_S = 1.0


class SocketPathError(RuntimeError):
    """A shard socket path that cannot be used; the message names the path and the flag."""


@contextmanager
def private_socket_prefix() -> Iterator[str]:
    """A socket prefix in a fresh directory only this launcher uses (mode 0700), removed on exit."""
    base = tempfile.gettempdir()
    # TMPDIR can be long (macOS's are ~50 bytes): keep room for "/switchyard-XXXXXXXX/shard-NN".
    if len(os.fsencode(base)) > MAX_SOCKET_PATH_BYTES - 40:
        base = "/tmp"
    directory = tempfile.mkdtemp(prefix="switchyard-", dir=base)
    try:
        yield os.path.join(directory, "shard")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def socket_is_live(path: Path) -> bool:
    """True when something accepts connections on `path`; False when nothing listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False  # a socket left by a crashed run, a plain file, or nothing at all
        except TimeoutError:
            return True
        except OSError as exc:
            raise SocketPathError(
                f"shard socket {path} exists but cannot be probed ({exc.strerror}); remove it "
                f"or pass another {FLAG}"
            ) from None
    return True


def check_socket_paths(paths: Sequence[Path]) -> None:
    """Raises SocketPathError, naming the path and the flag, if a socket cannot be bound or is
    still served by a running process. Removes nothing."""
    for path in paths:
        size = len(os.fsencode(str(path)))
        if size > MAX_SOCKET_PATH_BYTES:
            raise SocketPathError(
                f"shard socket path {path} is {size} bytes, more than the {MAX_SOCKET_PATH_BYTES} "
                f"a unix socket allows; pass a shorter {FLAG}"
            )
        if path.is_dir():
            raise SocketPathError(f"shard socket path {path} is a directory; pass another {FLAG}")
        if (path.exists() or path.is_symlink()) and socket_is_live(path):
            raise SocketPathError(
                f"shard socket {path} is in use: another server is listening on it. Stop that "
                f"server or pass a different {FLAG} (by default every launcher gets its own)"
            )


def claim_socket_paths(paths: Sequence[Path]) -> None:
    """Checks the paths, then removes what a crashed earlier run left there: binding over it would
    fail, and the readiness probe could mistake it for a live shard."""
    check_socket_paths(paths)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.exists() or path.is_symlink()):
            continue
        log.info("removing stale socket %s (nothing listens on it)", path)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise SocketPathError(
                f"cannot remove the stale shard socket {path} ({exc.strerror}); remove it or "
                f"pass another {FLAG}"
            ) from None
