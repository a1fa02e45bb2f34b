"""Model loading: local directories, hub ids from the offline cache, chat template sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from render_service import Renderer
from render_service.model.default_model import ensure_default_model
from render_service.model.loading import load_chat_template_arg, resolve_model_path


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Point the hub client at ``cache``, offline (it reads its settings at import time)."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(Path(tmp_path_factory.mktemp("loading-model")))


def test_hub_id_resolves_from_the_offline_cache(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-chat" / "snapshots" / ("0" * 40)
    shutil.copytree(model_dir, snapshot)
    (cache / "models--acme--tiny-chat" / "refs").mkdir()
    (cache / "models--acme--tiny-chat" / "refs" / "main").write_text("0" * 40)
    use_hub_cache(monkeypatch, cache)
    assert resolve_model_path("acme/tiny-chat") == snapshot
    renderer = Renderer.from_pretrained("acme/tiny-chat")
    assert renderer.model_name == "acme/tiny-chat"
    assert renderer.render_chat({"messages": [{"role": "user", "content": "hi"}]}).token_ids


def test_unknown_hub_id_offline_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hub_cache(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError, match="acme/missing"):
        resolve_model_path("acme/missing")


def test_chat_template_from_file_literal_and_jinja_file(model_dir: Path, tmp_path: Path) -> None:
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert load_chat_template_arg(str(path)) == template
    assert load_chat_template_arg(template) == template
    with pytest.raises(FileNotFoundError):
        load_chat_template_arg("no-such-template-file")
    local = tmp_path / "model"
    shutil.copytree(model_dir, local)
    config = json.loads((local / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (local / "tokenizer_config.json").write_text(json.dumps(config))
    (local / "chat_template.jinja").write_text(template)
    renderer = Renderer.from_pretrained(str(local))
    ids = renderer.render_chat({"messages": [{"role": "user", "content": "x"}]}).token_ids
    assert renderer.model.decode(ids) == "[user]x"
    flagged = Renderer.from_pretrained(str(model_dir), chat_template=str(path))
    ids = flagged.render_chat({"messages": [{"role": "user", "content": "y"}]}).token_ids
    assert flagged.model.decode(ids) == "[user]y"


def test_max_model_len_flag_bounds_the_context(model_dir: Path) -> None:
    renderer = Renderer.from_pretrained(str(model_dir), max_model_len=64)
    assert renderer.model.info.max_model_len == 64
    rendered = renderer.render_chat({"messages": [{"role": "user", "content": "hi"}]})
    assert rendered.sampling_params["max_tokens"] == 64 - len(rendered.token_ids)


@pytest.mark.parametrize(
    ("rope_scaling", "expected"),
    [
        (None, 4096),
        ({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}, 4096),
        ({"rope_type": "llama3", "factor": 8.0}, 4096),
        ({"type": "dynamic", "factor": 2.0}, 8192),
        ({"rope_type": "linear", "factor": 4}, 16384),
        ({"type": "mrope", "mrope_section": [16, 24, 24]}, 4096),
    ],
)
def test_context_length_scales_by_rope_factor_as_vllm_does(
    rope_scaling: dict[str, object] | None, expected: int
) -> None:
    # vLLM 0.33 leaves YaRN, llama3 and longrope contexts at max_position_embeddings
    # (DeepSeek-V3.1 renders max_tokens against 163840, not 163840 x 40).
    from render_service.model.loading import _max_model_len

    config = {"max_position_embeddings": 4096, "rope_scaling": rope_scaling}
    assert _max_model_len(config) == expected
