"""Derender logprobs equal vLLM 0.33.0's, batch and per streamed chunk, for the golden corpus."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from render_service.derender.logprobs import (
    TokenTexts,
    advance_text_offset,
    chat_logprobs,
    chat_top_limit,
    completion_logprobs,
    completion_top_limit,
)
from render_service.protocol.logprobs import GenerateLogProbsContent
from tests.golden import GOLDEN, MODELS, load_case, needs_shared

pytestmark = needs_shared

_CONTENT = list[GenerateLogProbsContent]


@cache
def _tokenizer(model: str) -> Any:
    """The model's tokenizer: `tokenizer.json`, or Mistral's `tekken.json` (mistral-common)."""
    if (MODELS / model / "tekken.json").is_file():
        pytest.importorskip("mistral_common", reason="the mistral extra is not installed")
        from render_service.model.mistral import MistralTokenizer

        return MistralTokenizer.from_directory(MODELS / model)
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(MODELS / model / "tokenizer.json"))


def _has_tokenizer(model: str) -> bool:
    return any((MODELS / model / name).is_file() for name in ("tokenizer.json", "tekken.json"))


def needs_model(model: str) -> None:
    if not _has_tokenizer(model):
        pytest.skip(f"{model} tokenizer is not present")


@cache
def _texts(model: str) -> TokenTexts:
    tok = _tokenizer(model)
    if isinstance(tok, tokenizers_module().Tokenizer):
        return TokenTexts.for_tokenizer(tok)
    return TokenTexts(lambda ids: tok.decode(list(ids)), lambda token: 0 <= token < tok.vocab_size)


def tokenizers_module() -> Any:
    return pytest.importorskip("tokenizers")


def _asks_for_logprobs(case: dict[str, Any]) -> bool:
    request = case.get("request") or {}
    responses = request.get("generate_responses") or [request.get("generate_response")]
    return any(
        isinstance(response, dict)
        and any(choice.get("logprobs") is not None for choice in response.get("choices", []))
        for response in responses
    )


def _cases() -> Iterator[Any]:
    """Golden derender cases whose generate output carries logprobs, for models we can load."""
    if not GOLDEN.is_dir():
        return
    for directory in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        for path in sorted((directory / "derender").glob("*.json")):
            case = load_case(path)
            if case.get("kind") not in ("chat", "completion") or case.get("status") != 200:
                continue
            if not _asks_for_logprobs(case):
                continue
            marks = []
            if not _has_tokenizer(case["model"]):
                marks.append(pytest.mark.skip(reason=f"{case['model']} has no tokenizer file"))
            yield pytest.param(path, id=f"{directory.name}/{path.stem}", marks=marks)


CASES = list(_cases())


def _content(logprobs: dict[str, Any] | None) -> _CONTENT | None:
    if logprobs is None or logprobs.get("content") is None:
        return None
    return msgspec.convert(logprobs["content"], _CONTENT)


def _chat_limit(chat_request: dict[str, Any] | None) -> int | None:
    if chat_request is None:
        return chat_top_limit(None, None, None)
    return chat_top_limit(
        chat_request.get("logprobs"),
        chat_request.get("top_logprobs"),
        chat_request.get("logprob_token_ids"),
    )


def _completion_limit(completion_request: dict[str, Any] | None) -> int | None:
    if completion_request is None:
        return None
    return completion_top_limit(
        completion_request.get("logprobs"), completion_request.get("logprob_token_ids")
    )


def _hidden(case: dict[str, Any], chat_request: dict[str, Any] | None) -> bool:
    """vLLM drops chat logprobs when a parser hides reasoning (include_reasoning=false)."""
    parser = any(f in case["server_flags"] for f in ("--reasoning-parser", "--tool-call-parser"))
    is_harmony = case["model"] == "gpt-oss"
    return (
        (parser or is_harmony)
        and chat_request is not None
        and chat_request.get("include_reasoning") is False
    )


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


@pytest.mark.parametrize("path", CASES)
def test_batch_logprobs_match_vllm(path: Path) -> None:
    case = load_case(path)
    texts = _texts(case["model"])
    request = case["request"]
    got: list[Any] = []
    if case["kind"] == "chat":
        chat_request = request.get("chat_request")
        limit = _chat_limit(chat_request)
        for choice in request["generate_response"]["choices"]:
            if choice["logprobs"] is None or _hidden(case, chat_request):
                got.append(None)
                continue
            logprobs, _ = chat_logprobs(_content(choice["logprobs"]), texts, top_limit=limit)
            got.append(_builtins(logprobs))
    else:
        limit = _completion_limit(request.get("completion_request"))
        for response in request["generate_responses"]:
            for choice in response["choices"]:
                if choice["logprobs"] is None:
                    got.append(None)
                    continue
                cmpl, _ = completion_logprobs(_content(choice["logprobs"]), texts, top_limit=limit)
                got.append(_builtins(cmpl))
    expected = [choice["logprobs"] for choice in case["response"]["choices"]]
    assert got == expected


@pytest.mark.parametrize("path", CASES)
def test_stream_logprobs_match_vllm_per_chunk(path: Path) -> None:
    """Each chunk's logprobs, with the context (and completions offset) carried between calls."""
    case = load_case(path)
    if not case.get("stream"):
        pytest.skip("batch-only case (no stored stream)")
    texts = _texts(case["model"])
    base = case["stream"]["request_base"]
    chat_request = base.get("chat_request")
    for name, chunking in case["stream"]["chunkings"].items():
        context: tuple[int, ...] = ()
        offset = 0
        for number, call in enumerate(chunking["calls"]):
            assert call["status"] == 200
            if not call["generate_chunk"]["choices"]:
                continue
            (choice,) = call["generate_chunk"]["choices"]
            (out,) = call["chunk"]["choices"]
            content = _content(choice["logprobs"])
            ids = choice["token_ids"] or []
            got: Any
            if case["kind"] == "chat":
                logprobs, context = chat_logprobs(
                    content,
                    texts,
                    top_limit=_chat_limit(chat_request),
                    context_ids=context,
                    sampled_ids=ids,
                )
                hidden = choice["logprobs"] is None or _hidden(case, chat_request)
                got = None if hidden else _builtins(logprobs)
            else:
                cmpl, context = completion_logprobs(
                    content,
                    texts,
                    top_limit=_completion_limit(base.get("completion_request")),
                    context_ids=context,
                    text_offset=offset,
                    sampled_ids=ids,
                )
                kept = None if choice["logprobs"] is None else cmpl
                offset = advance_text_offset(offset, kept, out["text"])
                got = None if kept is None else _builtins(kept)
            assert got == out["logprobs"], f"{name} call {number}"


def test_cases_found() -> None:
    """The corpus has logprob cases for chat and completions; losing them would hide bugs."""
    kinds = {load_case(p.values[0])["kind"] for p in CASES if not p.marks}
    assert kinds == {"chat", "completion"}


def _split_cases() -> Iterator[Any]:
    """Golden outputs with ids that decode alone to U+FFFD but whole to clean text."""
    if not GOLDEN.is_dir():
        return
    for path in sorted(GOLDEN.glob("*/derender/*.json")):
        case = load_case(path)
        if case.get("kind") not in ("chat", "completion") or case.get("status") != 200:
            continue
        if not _has_tokenizer(case["model"]):
            continue
        for output in case["output"]:
            yield pytest.param(
                case["model"],
                output["token_ids"],
                id=f"{path.parent.parent.name}/{path.stem}/{output['index']}",
            )


def _byte_split_outputs() -> list[Any]:
    found = []
    for param in _split_cases():
        model, ids = param.values
        tok = _tokenizer(model)
        cut = any("\ufffd" in tok.decode([i], skip_special_tokens=False) for i in ids)
        if cut and "\ufffd" not in tok.decode(ids, skip_special_tokens=False):
            found.append(param)
    return found


def _sampled_only(ids: Sequence[int], candidates: Sequence[int] = ()) -> _CONTENT:
    return msgspec.convert(
        [
            {
                "token_id": i,
                "logprob": -0.5,
                "rank": 1,
                "top_logprobs": [{"token_id": t, "logprob": -1.0} for t in (i, *candidates)],
            }
            for i in ids
        ],
        _CONTENT,
    )


BYTE_SPLIT = _byte_split_outputs() if GOLDEN.is_dir() else []


@pytest.mark.parametrize(("model", "ids"), BYTE_SPLIT)
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_cut_characters_repair_across_chunks(model: str, ids: list[int], chunk: int) -> None:
    """Sampled token texts join to the tokenizer's decode of the whole output, however the
    output is chunked, when the carried context crosses chunk boundaries."""
    tok = _tokenizer(model)
    texts = _texts(model)
    context: tuple[int, ...] = ()
    tokens: list[str] = []
    candidates: list[str] = []
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        logprobs, context = chat_logprobs(
            _sampled_only(part), texts, top_limit=None, context_ids=context
        )
        assert logprobs.content is not None
        tokens += [p.token for p in logprobs.content]
        candidates += [p.top_logprobs[0].token for p in logprobs.content]
        for position in logprobs.content:
            assert position.bytes == list(position.token.encode())
    assert "".join(tokens) == tok.decode(ids, skip_special_tokens=False)
    assert candidates == tokens


CUT_IDS = [9707, 1879, 0, 220, 16]
CANDIDATES = [279, 264, 323, 311]


@pytest.mark.parametrize(
    ("logprobs", "top_logprobs", "token_ids", "kept"),
    [
        (True, 2, None, 2),
        (True, 0, None, 0),
        (True, None, None, 0),
        (True, -1, None, 5),
        (True, 1, [5, 6], 5),
        (False, 3, None, 5),
        (None, None, None, 5),
    ],
)
def test_chat_cut(
    logprobs: bool | None, top_logprobs: int | None, token_ids: list[int] | None, kept: int
) -> None:
    """Chat keeps the first top_logprobs candidates in generate's order (sampled first)."""
    needs_model("qwen3")
    tok = _tokenizer("qwen3")
    limit = chat_top_limit(logprobs, top_logprobs, token_ids)
    result, _ = chat_logprobs(_sampled_only(CUT_IDS, CANDIDATES), _texts("qwen3"), top_limit=limit)
    assert result.content is not None
    for sampled, position in zip(CUT_IDS, result.content, strict=True):
        want = [sampled, *CANDIDATES][:kept]
        assert [t.token for t in position.top_logprobs] == [tok.decode([i]) for i in want]
        assert position.token == tok.decode([sampled])


@pytest.mark.parametrize(
    ("logprobs", "token_ids", "kept"),
    [(0, None, 1), (2, None, 3), (9, None, 5), (-1, None, 5), (None, None, 5), (1, [3], 5)],
)
def test_completion_cut(logprobs: int | None, token_ids: list[int] | None, kept: int) -> None:
    """Completions keep logprobs + 1 candidates, as a token -> logprob dict."""
    needs_model("qwen3")
    tok = _tokenizer("qwen3")
    limit = completion_top_limit(logprobs, token_ids)
    result, _ = completion_logprobs(
        _sampled_only(CUT_IDS, CANDIDATES), _texts("qwen3"), top_limit=limit
    )
    for sampled, top in zip(CUT_IDS, result.top_logprobs, strict=True):
        assert top is not None
        assert list(top) == [tok.decode([i]) for i in [sampled, *CANDIDATES][:kept]]


def test_completion_offsets_follow_token_texts() -> None:
    needs_model("qwen3")
    tok = _tokenizer("qwen3")
    ids = tok.encode("Hello world, 12 apples<|im_end|>", add_special_tokens=False).ids
    result, _ = completion_logprobs(
        _sampled_only(ids), _texts("qwen3"), top_limit=None, text_offset=7
    )
    pieces = [tok.decode([i], skip_special_tokens=False) for i in ids]
    assert result.tokens == pieces
    assert result.text_offset == [7 + len("".join(pieces[:n])) for n in range(len(ids))]
    after = advance_text_offset(7, result, "ignored when there are positions")
    assert after == 7 + len("".join(pieces))
    assert advance_text_offset(7, None, "abc") == 10
    empty, _ = completion_logprobs([], _texts("qwen3"), top_limit=None, text_offset=7)
    assert advance_text_offset(7, empty, "abc") == 10


def test_no_candidates_and_unknown_ids() -> None:
    """A position without candidates has null top_logprobs in completions; an id outside the
    tokenizer's vocabulary (the model's vocabulary is larger) has empty text and null bytes."""
    needs_model("qwen3")
    tok = _tokenizer("qwen3")
    unknown = tok.get_vocab_size(with_added_tokens=True) + 5
    assert tok.id_to_token(unknown) is None
    content = msgspec.convert(
        [
            {"token_id": 9707, "logprob": -0.1, "top_logprobs": []},
            {"token_id": unknown, "logprob": -0.2, "rank": None},
        ],
        _CONTENT,
    )
    cmpl, context = completion_logprobs(content, _texts("qwen3"), top_limit=None)
    assert cmpl.top_logprobs == [None, None]
    assert cmpl.tokens == [tok.decode([9707]), ""]
    assert context == (9707, unknown)
    chat, _ = chat_logprobs(content, _texts("qwen3"), top_limit=2)
    assert chat.content is not None
    assert [p.top_logprobs for p in chat.content] == [[], []]
    assert chat.content[1].bytes is None
    empty, context = chat_logprobs(None, _texts("qwen3"), top_limit=None, sampled_ids=[1, 2])
    assert empty.content is None
    assert context == (1, 2)


def test_context_keeps_last_sampled_ids() -> None:
    needs_model("qwen3")
    _, context = chat_logprobs(
        _sampled_only([1, 2, 3]), _texts("qwen3"), top_limit=0, context_ids=(7, 8, 9)
    )
    assert context == (8, 9, 1, 2, 3)[-4:]
