"""Derender logprobs equal vLLM 0.33.0's, batch and per streamed chunk, for the golden corpus."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from render_service.logprobs import (
    GenerateLogProbsContent,
    TokenTexts,
    advance_text_offset,
    chat_logprobs,
    chat_top_limit,
    completion_logprobs,
    completion_top_limit,
)
from tests.golden import GOLDEN, MODELS, load_case, needs_shared

pytestmark = needs_shared

_CONTENT = list[GenerateLogProbsContent]


@cache
def _tokenizer(model: str) -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(MODELS / model / "tokenizer.json"))


@cache
def _texts(model: str) -> TokenTexts:
    tok = _tokenizer(model)

    def decode(ids: Sequence[int]) -> str:
        text: str = tok.decode(list(ids), skip_special_tokens=False)
        return text

    return TokenTexts(decode, lambda token_id: tok.id_to_token(token_id) is not None)


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
            if not (MODELS / case["model"] / "tokenizer.json").is_file():
                marks.append(pytest.mark.skip(reason=f"{case['model']} has no tokenizer.json"))
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
