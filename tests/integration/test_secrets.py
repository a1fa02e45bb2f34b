"""The API key and the state secret reach the server's workers in a file only its user can
read, removed at exit; never through an environment variable (which every child inherits)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from tests.integration.server import running_server

KEY = "integration-api-key-0123456789"
SECRET = "integration-state-secret-0123456789abcdef"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(): v.decode(errors="replace") for k, _, v in pairs}


def test_secrets_are_in_a_private_file_not_in_the_environment(
    default_model_dir: Path, tmp_path: Path
) -> None:
    # Two workers: uvicorn spawns them, so they start with whatever environment the parent set.
    argv = [str(default_model_dir), "--api-key", KEY, "--state-secret", SECRET, "--workers", "2"]
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    with running_server(argv, tmp_path, env={"TMPDIR": str(private_tmp)}) as server:
        with server.client() as client:
            assert client.get("/v1/models").status_code == 401
            ok = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200
        pids = [server.process.pid]
        for task in Path(f"/proc/{server.process.pid}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
        assert len(pids) >= 3  # the parent and its two workers
        for pid in pids:
            values = environ(pid).values()
            assert not [v for v in values if KEY in v or SECRET in v]
        (path,) = private_tmp.glob("render-service-*/settings.json")
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert KEY in path.read_text()
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not path.parent.exists()
