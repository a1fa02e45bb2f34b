"""vLLM 0.33.0's render server as the peer: install it into its own venv once, then start it.

The install follows ../shared/peer/INSTALL.md step by step: vLLM without dependency resolution
(its pins pull a CUDA torch), a CPU torch 2.13.0, then its runtime dependencies under a
constraint that keeps torch where it is. A marker file written last makes reuse cheap and lets an
interrupted install start over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

VLLM_VERSION = "0.33.0"
DEFAULT_VENV = Path.home() / ".cache" / "render-service-bench" / f"vllm-{VLLM_VERSION}"
VENV_ENV = "RENDER_BENCH_VLLM_VENV"
_MARKER = ".render-bench-installed"

_DEPS = [
    "regex",
    "cachetools",
    "psutil",
    "sentencepiece",
    "numpy",
    "requests>=2.33.0",
    "certifi>=2026.10.19",
    "tqdm",
    "blake3",
    "py-cpuinfo",
    "transformers<5.21.0,>=5.16.1",
    "huggingface_hub>=1.31.0",
    "tokenizers>=0.23.2",
    "safetensors>=0.6.2",
    "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,"
    "!=6.33.3.*,!=6.33.4.*",
    "fastapi[standard]<0.137.0,>=0.133.0",
    "starlette>=1.0.1",
    "aiohttp>=3.14.4",
    "multidict>=6.9.1",
    "openai>=2.25.0",
    "pydantic>=2.12.0",
    "orjson>=3.11.6",
    "prometheus_client>=0.18.0",
    "pillow>=13.0.0",
    "prometheus-fastapi-instrumentator>=8.0.0",
    "tiktoken>=0.6.0",
    "typing_extensions>=4.10",
    "filelock>=3.20.3",
    "partial-json-parser",
    "jsonschema>=4.23.0",
    "pyzmq>=25.0.0",
    "msgspec",
    "pyyaml",
    "einops",
    "cloudpickle",
    "watchfiles",
    "python-json-logger",
    "pybase64",
    "cbor2",
    "ijson",
    "setproctitle",
    "oss-harmony>=0.0.11",
    "anthropic>=0.71.0",
    "model-hosting-container-standards<1.0.0,>=0.1.14",
    "mcp<3.0.0,>=2.2.0",
    "opentelemetry-sdk>=1.27.0",
    "opentelemetry-api>=1.27.0",
    "opentelemetry-exporter-otlp>=1.27.0",
    "opentelemetry-semantic-conventions-ai>=0.4.1",
    "uvloop",
    "httpx",
    "xgrammar==0.2.8",
    "llguidance<1.8.0,>=1.7.0",
    "outlines_core==0.2.14",
    "lark==1.2.2",
    "lm-format-enforcer==0.11.3",
    "mistral_common>=1.11.6",
]


def venv_dir(flag: str | None) -> Path:
    """The peer venv: the flag, else the environment variable, else the default cache path."""
    if flag:
        return Path(flag).expanduser()
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV]).expanduser()
    return DEFAULT_VENV


def vllm_bin(venv: Path) -> Path:
    return venv / "bin" / "vllm"


def is_installed(venv: Path) -> bool:
    return (venv / _MARKER).exists() and vllm_bin(venv).exists()


def ensure_installed(venv: Path, log: Callable[[str], None] = print) -> None:
    """Install vLLM into `venv` unless a finished install is already there."""
    if is_installed(venv):
        log(f"peer: reusing vLLM {VLLM_VERSION} in {venv}")
        return
    log(f"peer: installing vLLM {VLLM_VERSION} into {venv} (slow, first use only)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    py = venv / "bin" / "python"
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", f"vllm=={VLLM_VERSION}"])
    _run([*pip, "torch==2.13.0"])
    constraints = venv / "vllm-peer-constraints.txt"
    constraints.write_text("torch==2.13.0\n")
    _run([*pip, "-c", str(constraints), *_DEPS])
    (venv / _MARKER).write_text(f"vllm=={VLLM_VERSION}\n")
    log("peer: install finished")


TORCHVISION_VERSION = "0.28.0"  # the golden corpus's, built for torch 2.13
_VISION_MARKER = ".render-bench-vision"
# PyPI's torchvision is a CUDA build: its C++ ops cannot load beside the CPU torch, and its
# module then fails on registering fake kernels for two of those ops (nms, qnms). Qwen2-VL's
# processor only needs the Python transforms, so those two registrations are made conditional.
_FAKE_NMS = '@torch.library.register_fake("torchvision::{op}")'
_GUARDED_NMS = (
    '@(torch.library.register_fake("torchvision::{op}") '
    "if torchvision.extension._has_ops() else (lambda f: f))"
)


def ensure_vision(venv: Path, log: Callable[[str], None] = print) -> None:
    """Add torchvision's image transforms to the peer (image render needs them)."""
    if (venv / _VISION_MARKER).exists():
        return
    log(f"peer: installing torchvision {TORCHVISION_VERSION} (Python transforms only)")
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--no-deps", f"torchvision=={TORCHVISION_VERSION}"])
    found = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('torchvision').origin)"],
        check=True,
        capture_output=True,
        text=True,
    )
    registrations = Path(found.stdout.strip()).parent / "_meta_registrations.py"
    text = registrations.read_text()
    for op in ("nms", "qnms"):
        text = text.replace(_FAKE_NMS.format(op=op), _GUARDED_NMS.format(op=op))
    registrations.write_text(text)
    _run([str(py), "-c", "import torchvision.transforms.v2"])
    (venv / _VISION_MARKER).write_text(f"torchvision=={TORCHVISION_VERSION}\n")


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True)


def server_command(venv: Path, model: Path, port: int, parser_flags: list[str]) -> list[str]:
    return [
        str(vllm_bin(venv)),
        "launch",
        "render",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *parser_flags,
    ]


def server_env() -> dict[str, str]:
    """The peer needs VLLM_TARGET_DEVICE=cpu, else platform detection fails; offline hub."""
    return {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
