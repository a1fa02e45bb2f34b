"""Run Debian's nginx on 127.0.0.1 in front of test replicas, with the shipped proxy settings."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.integration.server import REPO, free_port

PROXY_CONF = REPO / "docker" / "render-proxy.conf"

# The shipped docker/nginx.conf, minus what only makes sense in a container: fixed upstream
# addresses instead of DNS, files in a temp dir, one foreground process owned by the test.
# X-Served-By exposes which replica answered, for the test only. Paths are quoted: the temp dir
# or the checkout may contain spaces.
_CONF = """
daemon off;
master_process off;
error_log {d[error.log]} info;
pid {d[nginx.pid]};
events {{ worker_connections 1024; }}
http {{
    access_log {d[access.log]};
    client_body_temp_path {d[body]};
    proxy_temp_path {d[proxy]};
    fastcgi_temp_path {d[fastcgi]};
    uwsgi_temp_path {d[uwsgi]};
    scgi_temp_path {d[scgi]};
    upstream render_service {{
{servers}
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        add_header X-Served-By $upstream_addr always;
        location / {{
            include {proxy_conf};
        }}
    }}
}}
"""


def nginx_quoted(path: Path) -> str:
    """A path as one nginx token, spaces included."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def nginx_binary() -> str:
    path = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if path is None:
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx-light)")
    return path


@contextmanager
def running_nginx(upstream_ports: Sequence[int], tmp_path: Path) -> Iterator[str]:
    """nginx balancing round robin over ``upstream_ports``; yields its base URL."""
    binary = nginx_binary()
    port = free_port()
    servers = "\n".join(
        f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;" for p in upstream_ports
    )
    conf = tmp_path / "nginx.conf"
    files = ("error.log", "nginx.pid", "access.log", "body", "proxy", "fastcgi", "uwsgi", "scgi")
    text = _CONF.format(
        d={name: nginx_quoted(tmp_path / name) for name in files},
        servers=servers,
        port=port,
        proxy_conf=nginx_quoted(PROXY_CONF),
    )
    conf.write_text(text)
    cmd = [binary, "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf)]
    check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            if process.poll() is not None:
                raise RuntimeError((tmp_path / "error.log").read_text())
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGQUIT)  # graceful stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
