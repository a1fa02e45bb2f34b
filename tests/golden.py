"""Access to the golden corpus of vLLM 0.33.0 outputs in ../shared (tests skip without it)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GOLDEN = SHARED / "golden"
MODELS = SHARED / "models"

needs_shared = pytest.mark.skipif(
    not GOLDEN.is_dir(),
    reason="../shared (golden corpus and model files) is not present in this checkout",
)


def model_dir(name: str) -> Path:
    return MODELS / name


def case_files(directory: str, kind: str) -> list[Path]:
    folder = GOLDEN / directory / kind
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@cache
def load_case(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def case_params(directories: list[str], kind: str) -> list[Any]:
    """pytest params (id dir/case) for the cases of some golden directories."""
    return [
        pytest.param(d, p, id=f"{d}/{p.stem}") for d in directories for p in case_files(d, kind)
    ]


# vLLM environment variables of golden servers, and our flag for each.
_ENV_FLAGS = {"VLLM_SYSTEM_START_DATE": "--system-start-date"}


def server_argv(case: dict[str, Any]) -> list[str]:
    """Our ``serve`` argv for the server that produced a golden case."""
    env = case.get("server_env") or {}
    return [
        str(model_dir(case["model"])),
        "--served-model-name",
        case["model"],
        *case["server_flags"],
        *(arg for name, value in env.items() for arg in (_ENV_FLAGS[name], value)),
    ]
