"""The Harmony encoding loads offline, and matches the model directory's tokenizer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import model_dir, needs_shared

LOAD = (
    "from openai_harmony import HarmonyEncodingName, load_harmony_encoding\n"
    "encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)\n"
    "print(encoding.encode('Hello, world!'))\n"
)


def test_the_encoding_loads_with_no_network_and_no_cache(tmp_path: Path) -> None:
    """oss-harmony embeds its vocabulary: no download, no cache file (unless
    TIKTOKEN_ENCODINGS_BASE names a directory to read it from)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], check=False).returncode != 0:
        pytest.skip("cannot make a network namespace here (needs unshare and root)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIKTOKEN")}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    done = subprocess.run(
        [unshare, "-n", sys.executable, "-c", LOAD],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[13225, 11, 2375, 0]"
    assert not any(tmp_path.rglob("*.tiktoken"))


@needs_shared
def test_the_model_directory_tokenizer_is_checked() -> None:
    from render_service.model.harmony import HarmonyEncoder, token_bytes
    from render_service.model.loading import load_model

    model = load_model(str(model_dir("gpt-oss")))
    assert isinstance(model.harmony, HarmonyEncoder)
    table = token_bytes(model.backend)
    assert table[model.harmony.special("<|channel|>")] == b"<|channel|>"
    assert b"".join(table[i] for i in model.backend.encode("naïve 😀").ids) == "naïve 😀".encode()
    with pytest.raises(ValueError, match="does not match"):
        HarmonyEncoder.load(lambda text: [0])
