"""Loading a tokenizer without transformers gives exactly transformers' tokenizer.

For every shared model directory, the model loaded from the files alone equals the one loaded
through ``AutoTokenizer.from_pretrained``: the backend's whole JSON, the special-token facts, the
ids of texts with and without special tokens, decoding, token strings and the model identity that
stream states are bound to. Cases the fast loader does not admit must fall back to transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service.model import hf_tokenizer
from render_service.model.loading import Model, load_model
from tests.golden import MODELS, model_dir, needs_shared

pytestmark = needs_shared

HF_MODELS = (
    sorted(p.name for p in MODELS.iterdir() if (p / "tokenizer.json").is_file())
    if MODELS.is_dir()
    else []
)
# The directories whose tokenizer class transformers rebuilds in ways not replicated (Gemma's
# tokenizer class builds its own backend and marks <mask> special).
NOT_ADMITTED = {"gemma-3-it"}

TEXTS = [
    "",
    "Hello world",
    "  leading and trailing spaces  ",
    "naïve café — 数据 🌍👩‍👩‍👧 ﬁ e\u0301 Ω\u212b",
    "line\r\nbreaks\n\n\ttabs\x00\x07",
    "def f(x):\n    return x ** 2  # it's",
    "12345678901234567890 3.14159",
    "<think>reasoning</think> then <|im_end|> and <|im_start|>user",
    "<|eot_id|><|begin_of_text|>x<|start_header_id|>",
    "<|return|><|channel|>final<|message|>hi<|end|>",
    "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜>",
    "[gMASK]<sop><|user|>hi<|assistant|>",
    "]~!b[]~b]user\nhi[e~[",
    "<|endoftext|> <|endoftext|>x",
    "not quite <|im_end| nor <think >",
]


@cache
def loaded(name: str, force_transformers: bool) -> Model:
    old = os.environ.pop(hf_tokenizer.LOADER_ENV, None)
    if force_transformers:
        os.environ[hf_tokenizer.LOADER_ENV] = "transformers"
    try:
        return load_model(str(model_dir(name)), served_model_name="m")
    finally:
        os.environ.pop(hf_tokenizer.LOADER_ENV, None)
        if old is not None:
            os.environ[hf_tokenizer.LOADER_ENV] = old


def pair(name: str) -> tuple[Model, Model]:
    return loaded(name, False), loaded(name, True)


@pytest.mark.parametrize("name", HF_MODELS)
def test_admitted_exactly_where_verified(name: str) -> None:
    fast, slow = pair(name)
    assert slow.hf is not None and slow.hf.by_transformers
    assert fast.hf is not None
    assert fast.hf.by_transformers == (name in NOT_ADMITTED)


@pytest.mark.parametrize("name", HF_MODELS)
def test_same_backend_and_facts(name: str) -> None:
    fast, slow = pair(name)
    assert fast.hf is not None and slow.hf is not None
    assert fast.hf_backend.to_str() == slow.hf_backend.to_str()
    assert fast.identity == slow.identity
    assert fast.info == slow.info
    assert fast.special_tokens_map == slow.special_tokens_map
    assert fast.hf.all_special_ids == slow.hf.all_special_ids
    assert (fast.hf.eos_token_id, fast.hf.bos_token_id) == (
        slow.hf.eos_token_id,
        slow.hf.bos_token_id,
    )
    assert fast.added_tokens() == slow.added_tokens()
    assert fast.special_ids() == slow.special_ids()
    assert fast.stream_special_ids() == slow.stream_special_ids()
    assert fast.vocab_size == slow.vocab_size
    # The facts equal transformers' own tokenizer's, not just ours built from it.
    hf = slow.hf_tokenizer
    assert {k: repr(v) for k, v in fast.hf_backend.get_added_tokens_decoder().items()} == {
        k: repr(v) for k, v in hf.added_tokens_decoder.items()
    }
    assert fast.special_tokens_map == hf.special_tokens_map
    assert sorted(fast.stream_special_ids(), key=str) == sorted(
        set(hf.all_special_ids) - {None}, key=str
    )
    ids = [*range(0, 300), *fast.added_tokens().values(), fast.vocab_size - 1]
    assert fast.token_strs(ids) == hf.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("name", HF_MODELS)
def test_same_ids_and_text(name: str) -> None:
    fast, slow = pair(name)
    hf = slow.hf_tokenizer
    texts = [*TEXTS, *(f"a{token}b {token}" for token in fast.added_tokens())]
    for text in texts:
        for special in (False, True):
            ids = fast.encode(text, special)
            assert ids == slow.encode(text, special) == hf.encode(text, add_special_tokens=special)
            for skip in (False, True):
                assert fast.decode(ids, skip) == slow.decode(ids, skip)
                assert fast.decode(ids, skip) == hf.decode(
                    ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
                )


@pytest.mark.parametrize("name", ["qwen3", "llama-3.1-instruct", "glm-4.5"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=80))
def test_random_text_encodes_the_same(name: str, text: str) -> None:
    fast, slow = pair(name)
    for special in (False, True):
        assert fast.encode(text, special) == slow.encode(text, special)


def test_the_qwen2_regex_is_transformers() -> None:
    from transformers.models.qwen2 import tokenization_qwen2

    assert hf_tokenizer.QWEN2_PRETOKENIZE_REGEX == tokenization_qwen2.PRETOKENIZE_REGEX


def test_the_special_token_names_are_transformers() -> None:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    assert (
        list(hf_tokenizer.SPECIAL_TOKEN_NAMES) == PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES
    )


def test_another_transformers_release_goes_through_transformers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import transformers

    assert hf_tokenizer.installed_transformers() == transformers.__version__
    directory = model_dir("qwen3")
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert hf_tokenizer.load_without_transformers(directory, config, "qwen3") is not None
    monkeypatch.setattr(hf_tokenizer, "VERIFIED_TRANSFORMERS", "5.99.")
    assert hf_tokenizer.load_without_transformers(directory, config, "qwen3") is None


def test_no_hub_id_pattern_can_match_a_local_path() -> None:
    """AutoTokenizer sends some hub ids to the generic class by their name; we always load a
    local path (absolute), which none of those patterns can match."""
    from transformers.models.auto.tokenization_auto import MODEL_IDS_TO_TOKENIZERS_BACKEND

    assert all(not p.startswith(("*", "/", "?", "[")) for p in MODEL_IDS_TO_TOKENIZERS_BACKEND)


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(model_dir(name), target)
    return target


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("qwen3", {"split_special_tokens": True}),
        ("qwen3", {"fix_mistral_regex": True}),
        ("qwen3", {"tokenizer_class": "SomethingElse"}),
        ("qwen3", {"additional_special_tokens": ["<|im_start|>", "<|not_there|>"]}),
        ("qwen3", {"unk_token": {"__type": "AddedToken", "content": "<|endoftext|>"}}),
        ("llama-3.1-instruct", {"pad_token": "<|no_such_token|>"}),
        ("llama-3.1-instruct", {"added_tokens_decoder": {}}),
        ("llama-3.1-instruct", {"image_token": {"__type": "AddedToken", "content": "x"}}),
    ],
)
def test_unverified_cases_go_through_transformers(
    name: str, changes: dict[str, object], tmp_path: Path
) -> None:
    directory = _copy(name, tmp_path)
    _edit_config(directory, **changes)
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    model_type = json.loads((directory / "config.json").read_text(encoding="utf-8"))["model_type"]
    admitted = hf_tokenizer.load_without_transformers(directory, config, model_type)
    if "unk_token" in changes:  # a serialized AddedToken naming an added token is admitted
        assert admitted is not None
        return
    assert admitted is None
    if "pad_token" not in changes and "tokenizer_class" not in changes:
        model = load_model(str(directory))
        assert model.hf is not None and model.hf.by_transformers


def test_a_file_without_post_processor_gets_transformers_template(tmp_path: Path) -> None:
    """MiniMax's tokenizer.json has none; transformers adds TemplateProcessing("$A:0")."""
    fast, slow = pair("minimax-m2.7")
    raw = json.loads((model_dir("minimax-m2.7") / "tokenizer.json").read_text(encoding="utf-8"))
    assert raw["post_processor"] is None
    assert fast.hf_backend.post_processor is not None
    assert fast.hf_backend.to_str() == slow.hf_backend.to_str()


def test_the_hf_tokenizer_loads_on_demand() -> None:
    fast, _ = pair("qwen3")
    assert fast.hf is not None and not fast.hf.by_transformers
    assert fast.hf_tokenizer.encode("hi there", add_special_tokens=False) == fast.encode(
        "hi there", False
    )


@pytest.mark.parametrize(
    "code",
    [
        "from render_service.library import Renderer\n"
        "r = Renderer.from_pretrained(MODEL)\n"
        "assert r.tokenize({'messages': [{'role': 'user', 'content': 'hi'}]}).tokens\n",
        "from render_service.http.app import build_app\n"
        "from render_service.render import Renderer\n"
        "build_app(Renderer.from_pretrained(MODEL))\n",
    ],
    ids=["library", "server"],
)
def test_transformers_is_not_imported(code: str, tmp_path: Path) -> None:
    program = f"import sys\nMODEL = {str(model_dir('qwen3'))!r}\n{code}print('transformers' in sys.modules)\n"
    env = {
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "HF_HUB_OFFLINE": "1",
        "PATH": os.environ.get("PATH", ""),
    }
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"
