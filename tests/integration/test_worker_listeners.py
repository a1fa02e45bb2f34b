"""With several workers, each worker listens on its own socket and new connections spread.

uvicorn's one shared socket let whichever worker woke first take a whole burst of keep-alive
connections; render_service.http.listeners gives each worker an SO_REUSEPORT socket instead.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.server import running_server

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="reads sockets from /proc; SO_REUSEPORT balancing is Linux's",
)


def _workers(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [int(pid) for pid in children if b"multiprocessing-fork" in _cmdline(int(pid))]


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _tcp_sockets() -> list[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of every IPv4 TCP socket."""
    rows = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        rows.append((local, remote, fields[3], fields[9]))
    return rows


def _listeners(port: int) -> set[str]:
    """The inodes of the listening TCP sockets on ``port``."""
    return {inode for local, _, state, inode in _tcp_sockets() if state == "0A" and local == port}


def _server_side_inode(port: int, client_port: int) -> str | None:
    for local, remote, _, inode in _tcp_sockets():
        if local == port and remote == client_port:
            return inode
    return None


def test_each_worker_listens_on_its_own_socket_and_both_get_connections(
    default_model_dir: Path, tmp_path: Path
) -> None:
    with running_server([str(default_model_dir), "--workers", "2"], tmp_path) as server:
        deadline = time.monotonic() + 30
        while len(_listeners(server.port)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = _workers(server.process.pid)
        listening = _listeners(server.port)
        owners = {pid: _socket_inodes(pid) & listening for pid in workers}
        # Two listening sockets, one in each worker; the supervisor's bound socket never listens.
        assert sorted(len(inodes) for inodes in owners.values() if inodes) == [1, 1]
        assert not _socket_inodes(server.process.pid) & listening

        served = {pid: 0 for pid in owners if owners[pid]}
        connections = []
        for _ in range(32):
            sock = socket.create_connection(("127.0.0.1", server.port))
            connections.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            inode = _server_side_inode(server.port, sock.getsockname()[1])
            for pid in served:
                if inode in _socket_inodes(pid):
                    served[pid] += 1
        for sock in connections:
            sock.close()
        assert sum(served.values()) == 32
        # Hashing 32 connections onto two sockets leaves one empty with probability 2^-31.
        assert all(count > 0 for count in served.values()), served
        assert httpx.get(f"{server.url}/health").status_code == 200
