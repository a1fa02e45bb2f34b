"""One listening socket per worker process, so that the kernel spreads connections evenly.

uvicorn's workers share one listening socket, and whichever worker wakes first accepts every
connection waiting there. A burst of new keep-alive connections (a router or load generator
opening its pool) lands mostly on one worker and stays there while the other cores idle: at 16
connections one worker spent 7 s of CPU in 8 s and the other 1 s. On Linux each worker instead
listens on its own ``SO_REUSEPORT`` socket and the kernel hashes every new connection to one of
them, as nginx's ``reuseport`` does.

The supervisor binds the address first, with ``SO_REUSEPORT`` but without listening: it holds
the port (an ephemeral one included) and tells each worker the address, and since it never
listens the kernel never queues a connection on it.
"""

from __future__ import annotations

import socket
import sys

from uvicorn import Config
from uvicorn.supervisors import multiprocess

__all__ = ["available", "run_workers"]


def available() -> bool:
    """Whether the kernel balances ``SO_REUSEPORT`` listeners (Linux; BSDs and macOS do not)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def run_workers(config: Config) -> None:
    """uvicorn's multi-process supervisor, with a listening socket of its own in each worker."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    group = _port_sharing_socket(family)
    group.bind((config.host, config.port))
    group.set_inheritable(True)
    # uvicorn's supervisor builds its workers from this module attribute (at start and on every
    # restart); the subclass differs only in what runs in the child.
    multiprocess.Process = _OwnSocketProcess  # type: ignore[misc]
    multiprocess.Multiprocess(config, sockets=[group]).run()


def _port_sharing_socket(family: socket.AddressFamily) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


class _OwnSocketProcess(multiprocess.Process):
    def target(self, sockets: list[socket.socket] | None = None) -> None:
        own = []
        for shared in sockets or []:
            sock = _port_sharing_socket(shared.family)
            sock.bind(shared.getsockname())
            shared.close()
            own.append(sock)
        super().target(own)
