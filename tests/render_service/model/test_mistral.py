"""Mistral tokenizer mode: tekken ids and text as vLLM 0.33 produces them.

Runs without ../shared: mistral-common ships the very tekken file of Mistral-Nemo-Instruct-2407
(`data/tekken_240718.json`, byte-identical to ../shared/models/mistral/tekken.json). Expected ids
are facts from vLLM 0.33.0's answers in the golden corpus (case named beside each).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from parsers.detokenizer import Detokenizer

mistral_common = pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.model.mistral import MistralTokenizer, MistralTokenizerError  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> MistralTokenizer:
    shipped = Path(mistral_common.__file__).parent / "data" / "tekken_240718.json"
    directory = tmp_path_factory.mktemp("mistral model")
    shutil.copy(shipped, directory / "tekken.json")
    return MistralTokenizer.from_directory(directory)


def test_vocabulary_facts(tok: MistralTokenizer) -> None:
    assert (tok.vocab_size, tok.num_special_tokens, tok.bos_token_id, tok.eos_token_id) == (
        131072,
        1000,
        1,
        2,
    )
    assert tok.control_tokens()["[TOOL_CALLS]"] == 9
    assert tok.piece(279) == "<SPECIAL_279>"  # mistral/derender/logprobs_answer
    assert 9 not in tok.dropped_ids and 2 in tok.dropped_ids


def test_encode_matches_vllm(tok: MistralTokenizer) -> None:
    # mistral/render/tokenize_prompt, tokenize_prompt_strs_no_special
    assert tok.encode("Hello, world! 你好 🌍") == [
        1,
        22177,
        1044,
        4304,
        1033,
        1032,
        124108,
        119685,
        1140,
        1141,
    ]
    ids = tok.encode("<think>tags</think> and <|im_end|> text", add_special_tokens=False)
    assert [tok.piece(i) for i in ids] == [
        "<th", "ink", ">", "tags", "</", "think", ">", " and", " <", "|", "im", "_end", "|", ">", " text",
    ]  # fmt: skip


def test_decode_spells_out_or_skips_control_tokens(tok: MistralTokenizer) -> None:
    ids = [1, 3, *tok.encode("Hi 🌍", add_special_tokens=False), 4, 2]
    assert tok.decode(ids) == "<s>[INST]Hi 🌍[/INST]</s>"
    assert tok.decode(ids, skip_special_tokens=True) == "Hi 🌍"


def test_stream_decoders(tok: MistralTokenizer) -> None:
    ids = [9, *tok.encode("a 🌍", add_special_tokens=False), 2]
    # With a parser (skip_special_tokens=False): each piece on its own, one U+FFFD per broken
    # piece (mistral/derender/emoji_multibyte); [TOOL_CALLS] kept, </s> dropped.
    by_piece = tok.stream_decoder(False)(ids)
    assert by_piece.startswith("[TOOL_CALLS]a ") and "🌍" not in by_piece and "\ufffd" in by_piece
    assert tok.stream_decoder(True)(ids) == "[TOOL_CALLS]a 🌍"


def _stream(detok: Detokenizer, prompt: Sequence[int], ids: Sequence[int]) -> list[str]:
    state = detok.start(prompt)
    texts = []
    for token in ids:
        state, text = detok.step(state, [token])
        texts.append(text)
    texts[-1] += detok.finish(state)[1]
    return texts


def test_incremental_decode_holds_broken_pieces_like_vllm(tok: MistralTokenizer) -> None:
    # mistral/derender/emoji_multibyte, one_token chunking: the text ending in U+FFFD is held
    # until a piece that does not end in one, then sent with one U+FFFD per piece.
    ids = tok.encode("巴黎 🇫🇷 (", add_special_tokens=False)
    detok = Detokenizer(tok.stream_decoder(False), tok.dropped_ids, skip_special_tokens=False)
    texts = _stream(detok, [1, 3, 4], ids)
    assert "".join(texts) == tok.stream_decoder(False)(ids)
    assert texts[-1].endswith(" (") and "\ufffd" in texts[-1]
    assert all(t == "" for t in texts[1:-1])


def test_encode_chat_like_vllm(tok: MistralTokenizer) -> None:
    hello = [{"role": "user", "content": "Hello!"}]
    assert tok.encode_chat(
        hello, None, add_generation_prompt=True, continue_final_message=False
    ) == [
        1,
        3,
        22177,
        1033,
        4,
    ]  # mistral/render/single_turn_no_model
    with_tools = tok.encode_chat(
        [{"role": "user", "content": "Weather in Paris?"}],
        TOOLS,
        add_generation_prompt=True,
        continue_final_message=False,
    )
    assert with_tools[:2] == [1, 5] and with_tools[-1] == 4  # <s>[AVAILABLE_TOOLS]…[/INST]
    assert 6 in with_tools  # [/AVAILABLE_TOOLS]


def _history(call_id: str) -> list[dict[str, object]]:
    return [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": '{"temp": 18}'},
    ]


def test_tool_call_ids_must_be_nine_alphanumerics(tok: MistralTokenizer) -> None:
    # mistral/render/history_tool_calls_results: vLLM's 400 message.
    with pytest.raises(MistralTokenizerError) as refused:
        tok.encode_chat(
            _history("call_a1"), TOOLS, add_generation_prompt=True, continue_final_message=False
        )
    assert (
        str(refused.value)
        == "Tool call id was call_a1 but must be a-z, A-Z, 0-9, with a length of 9."
    )
    ids = tok.encode_chat(
        _history("abcDEF123"), TOOLS, add_generation_prompt=True, continue_final_message=False
    )
    # Longer ids keep their last nine characters, as vLLM truncates them.
    longer = tok.encode_chat(
        _history("chatcmpl-tool-abcDEF123"),
        TOOLS,
        add_generation_prompt=True,
        continue_final_message=False,
    )
    assert longer == ids
    assert 9 in ids and 7 in ids  # [TOOL_CALLS] and [TOOL_RESULTS]


@pytest.mark.parametrize(
    ("messages", "add_generation_prompt", "continue_final_message", "message"),
    [
        (
            [{"role": "user", "content": "x"}],
            True,
            True,
            "Cannot set both `add_generation_prompt` and `continue_final_message` to True.",
        ),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
            True,
            False,
            "Cannot set `add_generation_prompt` to True when the last message is from the "
            "assistant. Consider using `continue_final_message` instead.",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "y",
                    "tool_calls": [
                        {
                            "id": "abcDEF123",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "user", "content": "z"},
            ],
            True,
            False,
            "Assistant message must have either content or tool_calls, but not both.",
        ),  # mistral/render/history_tool_call_with_content
        ([{"role": "wizard", "content": "x"}], True, False, "Unknown message role: wizard"),
    ],
)
def test_refusals_carry_vllms_message(
    tok: MistralTokenizer,
    messages: list[dict[str, object]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    message: str,
) -> None:
    with pytest.raises(MistralTokenizerError) as refused:
        tok.encode_chat(
            messages,
            None,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
    assert str(refused.value) == message


def test_continue_final_message_prefills(tok: MistralTokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    ids = tok.encode_chat(messages, None, add_generation_prompt=False, continue_final_message=True)
    assert ids[-1] != 2 and tok.decode(ids).endswith("Hello")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tekken\.json"):
        MistralTokenizer.from_directory(tmp_path)
