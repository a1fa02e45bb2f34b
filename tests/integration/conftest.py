from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from render_service.model.default_model import ensure_default_model
from tests.integration.server import RunningServer, running_server


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default model, built once per test session (no ../shared needed)."""
    return ensure_default_model(tmp_path_factory.mktemp("default-model"))


@pytest.fixture(scope="module")
def default_server(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A server on the embedded model with small limits, so limits are cheap to hit."""
    argv = [
        str(default_model_dir),
        "--served-model-name",
        "default",
        "--max-model-len",
        "256",
        "--max-body-bytes",
        "1048576",
    ]
    with running_server(argv, tmp_path_factory.mktemp("server")) as server:
        yield server
