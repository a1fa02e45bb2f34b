"""vLLM's render-server flags: the ones that apply are ours and reach Settings (and the model);
every other one is refused by name with its reason, and the table of vLLM's flags is vLLM's
own parser's where vLLM 0.33 is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from render_service import Renderer
from render_service.http.cli import build_parser, parse_settings
from render_service.http.vllm_flags import ENGINE, SERVER, refusal
from render_service.model.default_model import ensure_default_model

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path.home() / ".cache/render-service-bench/vllm-0.33.0/bin/python"
CHAT = {"messages": [{"role": "user", "content": "Hello!"}]}


def ours() -> list[str]:
    (serve,) = [
        a.choices["serve"] for a in build_parser()._actions if hasattr(a, "choices") and a.choices
    ]
    return [option for action in serve._actions for option in action.option_strings]


def run_serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_service", "serve", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def default_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(Path(tmp_path_factory.mktemp("flags-model")))


def test_vllm_render_flags_that_apply_reach_settings(tmp_path: Path) -> None:
    settings = parse_settings(
        [
            str(tmp_path),
            "--tokenizer",
            "/tok",
            "--trust-remote-code",
            "--revision",
            "main",
            "--tokenizer-revision",
            "v2",
            "--generation-config",
            "vllm",
            "--tool-strict-level",
            "parameter",
        ]
    )
    assert settings.tokenizer == "/tok" and settings.trust_remote_code
    assert (settings.revision, settings.tokenizer_revision) == ("main", "v2")
    assert settings.generation_config == "vllm" and settings.tool_strict_level == "parameter"


def test_every_vllm_flag_is_ours_or_refused_with_a_reason() -> None:
    mine = ours()
    for option in (*ENGINE, *SERVER):
        for spelling in option.split():
            if spelling in mine:
                assert refusal(spelling, mine) is None
            else:
                assert refusal(spelling, mine), spelling
    assert refusal("--no-such-flag", mine) is None


def test_refusals_say_why_and_what_to_do(tmp_path: Path) -> None:
    out = run_serve(
        str(tmp_path),
        "--tensor-parallel-size",
        "2",
        "--disable-auto-tool-choice",
        "--api-server-count=2",
        "--ssl-keyfile",
        "k.pem",
        "--tool-call",
    )
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert any("--tensor-parallel-size configures vLLM's engine" in line for line in lines)
    assert any("render-service's is --no-enable-auto-tool-choice" in line for line in lines)
    assert any("--api-server-count" in line and "use --workers" in line for line in lines)
    assert any("--ssl-keyfile is a vLLM server flag" in line for line in lines)
    assert any("did you mean --tool-call-parser?" in line for line in lines)
    assert "k.pem" not in out.stderr  # a refused flag's value is not reported again


def test_abbreviated_flags_are_not_taken_as_another() -> None:
    out = run_serve("--max-mess", "3")
    assert out.returncode == 2
    assert "did you mean --max-messages?" in out.stderr


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM 0.33.0's venv is not installed here")
def test_the_table_is_vllms_parser() -> None:
    script = (
        "import json\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.entrypoints.common.cli_args import make_arg_parser\n"
        "p = FlexibleArgumentParser()\n"
        "make_arg_parser(p)\n"
        "print(json.dumps([' '.join(a.option_strings) for a in p._actions"
        " if a.option_strings and a.dest != 'help']))\n"
    )
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        check=True,
    )
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(theirs) == sorted((*ENGINE, *SERVER))


def test_tokenizer_from_another_directory(default_model: Path, tmp_path: Path) -> None:
    """--tokenizer: ids and chat template from its directory, configuration from MODEL's."""
    model = tmp_path / "weights-only"
    model.mkdir()
    config = json.loads((default_model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    with Renderer.from_pretrained(str(default_model)) as reference:
        expected = reference.render_chat(CHAT).token_ids
    with Renderer.from_pretrained(str(model), tokenizer=str(default_model)) as split:
        assert split.render_chat(CHAT).token_ids == expected
        assert split.model.info.max_model_len == 1024
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        Renderer.from_pretrained(str(model), tokenizer=str(tmp_path / "missing"))


def test_generation_config_source(default_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.25}))
    with Renderer.from_pretrained(str(default_model), generation_config=str(folder)) as r:
        assert r.model.info.sampling_defaults == {"temperature": 0.25}
        assert r.render_chat(CHAT).sampling_params["temperature"] == 0.25
    with Renderer.from_pretrained(str(default_model), generation_config="vllm") as r:
        assert r.model.info.sampling_defaults == {}
    with pytest.raises(FileNotFoundError, match="--generation-config"):
        Renderer.from_pretrained(str(default_model), generation_config=str(tmp_path / "none"))


def test_trust_remote_code_lets_a_shipped_tokenizer_class_load(
    default_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer class in a file beside the model is run only with --trust-remote-code
    (without it transformers 5 loads its own class for the tokenizer.json)."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    model = tmp_path / "custom"
    shutil.copytree(default_model, model)
    (model / "custom_tokenizer.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class CustomTokenizer(PreTrainedTokenizerFast):\n"
        "    marker = 'shipped with the model'\n"
    )
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "custom_tokenizer.CustomTokenizer"]}
    config["tokenizer_class"] = "CustomTokenizer"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with Renderer.from_pretrained(str(model)) as r:  # transformers' own class, the file unrun
        assert not hasattr(r.model.hf_tokenizer, "marker")
    with Renderer.from_pretrained(str(model), trust_remote_code=True) as r:
        assert r.model.hf_tokenizer.marker == "shipped with the model"
        assert r.render_chat(CHAT).token_ids
