"""Derender answers equal vLLM 0.33.0's for the golden corpus, batch and every stored chunking.

Streaming is compared chunk by chunk: role, content, reasoning, finish_reason, stop_reason,
logprobs, token_ids and usage of every chunk. Tool-call deltas are compared by what they add up
to per call (name, arguments): we stream arguments as the model wrote them, so where vLLM's
hermes parser re-cuts them differently the fragments differ but never the result
(docs/compat.md). Ids and timestamps are ignored. Where vLLM is chunking-dependent or wrong, the
case sits in DIVERGENCES with the reason and we assert our answer equals vLLM's answer for the
named reference (another chunking or the batch response).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer
from tests.golden import case_params, load_case, needs_shared, server_argv

pytestmark = needs_shared

DIRECTORIES = [
    "qwen3",
    "qwen3-noparser",
    "qwen2.5-instruct",
    "deepseek-r1-distill-qwen",
    "llama-3.1-instruct",
    "deepseek-v3.1",
    "qwen3-coder",
    "gpt-oss",
    "gpt-oss-openai-tools",
    "gemma-3-it",
    "mistral",
]

PLAIN_LOOKALIKE = (
    "a <tool_call> typed as plain text is content (matched by token id); vLLM streaming cuts there"
)
MALFORMED = "malformed tool JSON streams as written whatever the chunking (vLLM: chunking-dependent; batch: content)"
CODER_LATER = (
    "content after a call inside one chunk is sent in that chunk; vLLM's engine sends it with the "
    "next chunk (the same text in total)"
)
CODER_TEXT_AFTER = (
    "text after </tool_call> is content for every chunking ('\\nDone.', vLLM's one-token stream "
    "loses the newline) and in batch ('Done.', stripped beside calls; vLLM batch drops it)"
)
DUPLICATE_END = (
    "a second </think> is dropped for every chunking (vLLM keeps it unless batch or whole)"
)
REPEATED_OPEN = "a repeated <think> at the start is absorbed for every chunking (vLLM keeps it only for random_1_5)"
THINK_IN_ANSWER = (
    "a <think> token after </think> is answer text (vLLM's whole chunking and batch drop text)"
)

LLAMA_WHOLE = (
    "a llama3_json call arriving in one chunk is a call (vLLM's whole chunking emits none)"
)
LLAMA_NOT_A_CALL = (
    "a JSON object that is not a call is content for any chunking (vLLM streaming drops it)"
)
LLAMA_BARE_ARGS = "bare arguments under a named tool choice are content (vLLM streaming drops them)"

HARMONY_JOINED = (
    "consecutive Harmony messages of one kind are concatenated as streamed (vLLM batch joins "
    "them with a newline)"
)
HARMONY_ARGS = (
    "tool arguments pass through as written (vLLM batch re-dumps them with \\uXXXX escapes)"
)
HARMONY_STOP_TOKEN = (
    "the stop token that ended the output is not text: vLLM feeds it to the Harmony parser, "
    "which keeps an unframed <|return|> or <|endoftext|> in the content"
)
HARMONY_STOP_STRING = "a stop string cuts the batch output (vLLM's Harmony batch path does not cut)"
_CAPITAL = "The capital of France is Paris."
_ASKS = "The user asks for the capital of France. It is Paris."
_MODES = ("batch", "one_token", "random_1_5", "whole")
# Harmony cases where no vLLM answer is ours (both gpt-oss directories serve model "gpt-oss").
_HARMONY_EXPECTED: dict[tuple[str, str, str], tuple[dict[str, Any], str]] = {
    **{
        ("gpt-oss", case, mode): (final, HARMONY_STOP_TOKEN)
        for case, final in (
            ("only_return", {"reasoning": None, "content": None, "tool_calls": []}),
            ("plain_text_no_markers", {"reasoning": None, "content": _CAPITAL, "tool_calls": []}),
            (
                "malformed_harmony",
                {
                    "reasoning": None,
                    "content": "<|channel|>final The capital is Paris.",
                    "tool_calls": [],
                },
            ),
            ("endoftext_stop", {"reasoning": _ASKS, "content": _CAPITAL, "tool_calls": []}),
        )
        for mode in _MODES
    },
    ("gpt-oss", "stop_string", "batch"): (
        {"reasoning": _ASKS, "content": "Line one.\n", "tool_calls": []},
        HARMONY_STOP_STRING,
    ),
}

DS_WHOLE = "a deepseek_v31 call in one generate chunk is a call (vLLM's whole chunking emits none)"
DS_CLOSING_PIECE = "the last argument piece arriving with <｜tool▁call▁end｜> is kept (vLLM cuts what does not end in '\"}')"
DS_MISSING_CALL_END = (
    "<｜tool▁calls▁end｜> closes a call missing its <｜tool▁call▁end｜>; it is not argument text "
    "(vLLM batch: nothing; streaming: the marker inside the arguments)"
)
DS_AS_STREAMED = (
    "batch is the accumulated stream (vLLM batch drops cut calls and text after the section)"
)
DS_EMPTY = "batch is the accumulated stream: empty reasoning null, an empty section content ''"
DS_FORCED_WHOLE = "a forced call in one chunk is the call; the stream has no '' deltas to add up"

_DS_CALL = ("get_weather", '{"city": "Paris", "unit": "celsius"}')
# Our answer where no vLLM answer equals it: (directory, case, mode) -> accumulated final.
EXPECTED: dict[tuple[str, str, str], dict[str, Any]] = {
    ("qwen3-coder", "text_after_tool_call", "batch"): {
        "reasoning": None,
        "content": "Done.",
        "tool_calls": [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
    },
    **{
        ("mistral", "tool_call_malformed_json", mode): {
            "reasoning": None,
            "content": None,
            "tool_calls": [("get_weather", '{"city": "Paris",, }')],
        }
        for mode in ("one_token", "random_1_5", "whole")
    },
    ("mistral", "tool_call_malformed_json", "batch"): {
        "reasoning": None,
        "content": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris",, }]',
        "tool_calls": [],
    },
    # The batch rule answers a cut call with the output as written, `[TOOL_CALLS]` included
    # (vLLM's batch keeps only the text after it).
    ("mistral", "tool_call_truncated_length", "batch"): {
        "reasoning": None,
        "content": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa',
        "tool_calls": [],
    },
    **{
        ("deepseek-v3.1", "missing_tool_call_end", mode): {
            "reasoning": None,
            # The one-token stream has vLLM's '' delta for the lone <｜tool▁calls▁begin｜>.
            "content": "" if mode == "one_token" else None,
            "tool_calls": [("get_weather", '{"city": "Paris"}')],
        }
        for mode in ("one_token", "random_1_5", "whole")
    },
    **{
        ("deepseek-v3.1", case, "whole"): {
            "reasoning": None,
            "content": None,
            "tool_calls": [_DS_CALL],
        }
        for case in ("tool_choice_named_markup", "tool_choice_required_markup")
    },
    **{key: final for key, (final, _) in _HARMONY_EXPECTED.items()},
}
MISTRAL_MALFORMED = (
    "malformed JSON after [TOOL_CALLS] streams as a call with the arguments as written, any "
    "chunking (vLLM: chunking-dependent); batch: the output as written, [TOOL_CALLS] included"
)
MISTRAL_KEPT = "text vLLM's Mistral streaming drops is content, as in vLLM batch (no text is lost)"
PYTHONIC_CALLS_KEPT = "calls that closed stay calls though the list never did (vLLM batch: content)"
PYTHONIC_CUT = "a call cut by max_tokens streams its partial arguments, any chunking"
MISTRAL_AS_WRITTEN = "a cut call's batch answer is the output as written, [TOOL_CALLS] included"
PYTHONIC_NOT_CALLS = (
    "a list that is not calls is content, as in vLLM batch (vLLM streaming loses or misreads it)"
)
PYTHONIC_TEXT_AFTER = (
    "calls, then text after the list as content (vLLM: content, or calls without the text)"
)
PYTHONIC_REQUIRED = (
    "tool_choice=required with a pythonic list gives its calls (vLLM: content '', output lost)"
)
PYTHONIC_UNCLOSED_STRING = (
    "a string that never closes gives partial arguments, nothing invented "
    "(vLLM streaming completes it, vLLM batch: content)"
)

# (directory, case, mode) -> (reference, reason). mode is a chunking name or "batch";
# reference is "batch", "stream:<chunking>" or "expected": our answer must equal vLLM's answer
# there, or (expected) the answer EXPECTED gives where vLLM gives none that is ours;
# "self:stream" (our one_token stream: the same for every chunking) or "self:calls" (those calls
# in our batch answer) where no vLLM answer is ours and EXPECTED would repeat the case.
DIVERGENCES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("qwen2.5-instruct", "literal_tool_call_in_prose", "one_token"): ("batch", PLAIN_LOOKALIKE),
    ("qwen2.5-instruct", "literal_tool_call_in_prose", "random_1_5"): ("batch", PLAIN_LOOKALIKE),
    ("qwen2.5-instruct", "literal_tool_call_in_prose", "whole"): ("batch", PLAIN_LOOKALIKE),
    ("qwen2.5-instruct", "tool_call_malformed_json", "random_1_5"): ("stream:one_token", MALFORMED),
    ("qwen2.5-instruct", "tool_call_malformed_json", "whole"): ("stream:one_token", MALFORMED),
    ("qwen3", "duplicate_end_think", "one_token"): ("stream:whole", DUPLICATE_END),
    ("qwen3", "duplicate_end_think", "random_1_5"): ("stream:whole", DUPLICATE_END),
    ("deepseek-r1-distill-qwen", "explicit_think_open", "random_1_5"): (
        "stream:one_token",
        REPEATED_OPEN,
    ),
    ("deepseek-r1-distill-qwen", "think_tag_in_answer", "whole"): (
        "stream:one_token",
        THINK_IN_ANSWER,
    ),
    **{
        ("llama-3.1-instruct", case, "whole"): ("stream:one_token", LLAMA_WHOLE)
        for case in (
            "parallel_false_two_calls",
            "tool_call_arguments_key",
            "tool_call_python_tag",
            "tool_choice_named",
            "tool_choice_required",
            "two_calls_semicolon",
        )
    },
    **{
        ("llama-3.1-instruct", case, chunking): ("batch", reason)
        for case, reason in (
            ("json_answer_not_a_call", LLAMA_NOT_A_CALL),
            ("tool_choice_named_raw_args", LLAMA_BARE_ARGS),
        )
        for chunking in ("one_token", "random_1_5", "whole")
    },
    ("qwen3-coder", "text_after_tool_call", "one_token"): ("stream:whole", CODER_TEXT_AFTER),
    ("qwen3-coder", "text_after_tool_call", "batch"): ("expected", CODER_TEXT_AFTER),
    ("qwen3-coder", "content_then_two_calls", "random_1_5"): ("stream:random_1_5", CODER_LATER),
    ("deepseek-r1-distill-qwen", "think_tag_in_answer", "batch"): (
        "stream:one_token",
        THINK_IN_ANSWER,
    ),
    **{
        ("deepseek-v3.1", case, "whole"): ("batch", DS_WHOLE)
        for case in (
            "logprobs_tool_call",
            "missing_tool_calls_end_eos",
            "parallel_false_two_calls",
            "return_token_ids_tool",
            "tool_call_after_reasoning",
            "tool_call_args_not_json",
            "tool_call_args_python_literal",
            "tool_call_long_arguments",
            "tool_call_single",
            "tool_call_unknown_function",
            "tool_call_v3_format",
            "two_parallel_tool_calls",
        )
    },
    ("deepseek-v3.1", "text_after_tool_calls", "whole"): ("stream:one_token", DS_WHOLE),
    ("deepseek-v3.1", "truncated_second_call", "whole"): ("stream:random_1_5", DS_WHOLE),
    **{
        ("deepseek-v3.1", case, "random_1_5"): ("stream:one_token", DS_CLOSING_PIECE)
        for case in (
            "tool_call_args_python_literal",
            "tool_call_long_arguments",
            "tool_call_v3_format",
            "two_parallel_tool_calls",
        )
    },
    **{
        ("deepseek-v3.1", "missing_tool_call_end", mode): ("expected", DS_MISSING_CALL_END)
        for mode in ("one_token", "random_1_5", "whole")
    },
    ("deepseek-v3.1", "tool_choice_named_markup", "whole"): ("expected", DS_FORCED_WHOLE),
    ("deepseek-v3.1", "tool_choice_required_markup", "whole"): ("expected", DS_FORCED_WHOLE),
    ("deepseek-v3.1", "text_after_tool_calls", "batch"): ("stream:one_token", DS_AS_STREAMED),
    ("deepseek-v3.1", "thinking_empty_reasoning", "batch"): ("stream:whole", DS_EMPTY),
    ("deepseek-v3.1", "tool_calls_empty_block", "batch"): ("stream:whole", DS_EMPTY),
    ("gpt-oss", "builtin_tool_recipient", "batch"): ("stream:whole", HARMONY_JOINED),
    ("gpt-oss", "commentary_preamble_then_final", "batch"): ("stream:whole", HARMONY_JOINED),
    ("gpt-oss-openai-tools", "tool_call_unicode_nested", "batch"): ("stream:whole", HARMONY_ARGS),
    **{
        (directory, case, mode): ("expected", reason)
        for (_, case, mode), (_, reason) in _HARMONY_EXPECTED.items()
        for directory in ("gpt-oss", "gpt-oss-openai-tools")
    },
    # Mistral (tekken v3, pre-v11 [TOOL_CALLS] JSON list), docs/compat.md "Mistral".
    **{
        ("mistral", "tool_call_malformed_json", mode): ("expected", MISTRAL_MALFORMED)
        for mode in ("batch", "one_token", "random_1_5", "whole")
    },
    ("mistral", "tool_call_truncated_length", "batch"): ("expected", MISTRAL_AS_WRITTEN),
    **{
        ("mistral", case, chunking): ("batch", MISTRAL_KEPT)
        for case in ("tool_choice_none_with_call", "tool_choice_named_raw_args")
        for chunking in ("one_token", "random_1_5", "whole")
    },
    # Gemma 3 with the pythonic parser, docs/compat.md "Gemma 3 with pythonic tool calls".
    ("gemma-3-it", "tool_call_unclosed_list", "batch"): ("stream:one_token", PYTHONIC_CALLS_KEPT),
    **{
        ("gemma-3-it", case, chunking): ("batch", PYTHONIC_NOT_CALLS)
        for case in ("tool_call_positional_arg", "json_list_not_pythonic", "truncated_after_name")
        for chunking in ("one_token", "random_1_5", "whole")
    },
    # Held-out cases named in the golden README whose streams no vLLM stream equals: ours must
    # be the same for every chunking (and, where vLLM's batch differs too, in batch).
    **{
        ("gemma-3-it", case, mode): ("self:stream", reason)
        for case, reason, modes in (
            ("tool_call_syntax_error", PYTHONIC_UNCLOSED_STRING, ("random_1_5", "whole")),
            ("truncated_in_arguments", PYTHONIC_CUT, ("random_1_5", "whole")),
            ("text_after_tool_calls", PYTHONIC_TEXT_AFTER, ("batch", "random_1_5", "whole")),
            ("tool_choice_required_pythonic", PYTHONIC_REQUIRED, ("random_1_5", "whole")),
        )
        for mode in modes
    },
    ("gemma-3-it", "tool_choice_required_pythonic", "batch"): ("self:calls", PYTHONIC_REQUIRED),
}


@cache
def client_for(argv: tuple[str, ...]) -> TestClient:
    return TestClient(build_app(Renderer.from_settings(parse_settings(list(argv)))))


def post(case: dict[str, Any], path: str, body: dict[str, Any]) -> Any:
    client = client_for(tuple(server_argv(case)))
    content = json.dumps(body, ensure_ascii=False).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def message_final(message: dict[str, Any]) -> dict[str, Any]:
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    return {
        "reasoning": message.get("reasoning"),
        "content": message.get("content"),
        "tool_calls": calls,
    }


def stream_final(final: dict[str, Any]) -> dict[str, Any]:
    calls = [(c["name"], c["arguments"]) for c in final.get("tool_calls") or []]
    return {
        "reasoning": final.get("reasoning"),
        "content": final.get("content"),
        "tool_calls": calls,
    }


def accumulate(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The client-side accumulation the golden README describes for `final`."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice["delta"]
            if delta.get("reasoning") is not None:
                reasoning.append(delta["reasoning"])
            if delta.get("content") is not None:
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("name"):
                    names[call["index"]] = names.get(call["index"], "") + function["name"]
                calls.setdefault(call["index"], []).append(function.get("arguments") or "")
    return {
        "reasoning": "".join(reasoning) if reasoning else None,
        "content": "".join(content) if content else None,
        "tool_calls": [(names.get(i, ""), "".join(calls[i])) for i in sorted(calls)],
    }


def reference_final(case: dict[str, Any], reference: str, mode: str = "") -> dict[str, Any]:
    if reference == "expected":
        return EXPECTED[(case["model"], case["name"], mode)]
    if reference == "self:stream":
        return accumulate(stream_chunks(case, "one_token"))
    if reference == "self:calls":  # our calls as streamed; the batch content is normalized
        streamed = accumulate(stream_chunks(case, "one_token"))
        batch = message_final(
            post(case, case["path"], case["request"]).json()["choices"][0]["message"]
        )
        return {**batch, "tool_calls": streamed["tool_calls"]}
    if reference == "batch":
        return message_final(case["response"]["choices"][0]["message"])
    return stream_final(case["stream"]["chunkings"][reference.removeprefix("stream:")]["final"])


def id_shape(call_id: str) -> str:
    """A tool-call id with every letter and digit as "x": vLLM's ids are random, their format
    is not (`chatcmpl-tool-` + 16 hex digits; Mistral's 9 letters and digits, which
    mistral-common checks when the call comes back in a conversation)."""
    return re.sub(r"[A-Za-z0-9]", "x", call_id)


def without_ids(calls: Any) -> Any:
    if not calls:
        return calls
    return [{**c, "id": id_shape(c["id"])} for c in calls]


def stream_id_shapes(chunks: list[dict[str, Any]]) -> set[str]:
    return {
        id_shape(call["id"])
        for chunk in chunks
        for choice in chunk.get("choices") or []
        for call in choice["delta"].get("tool_calls") or []
        if call.get("id")
    }


def comparable_choice(choice: dict[str, Any]) -> dict[str, Any]:
    out = dict(choice)
    message = dict(out["message"])
    message["tool_calls"] = without_ids(message.get("tool_calls"))
    out["message"] = message
    return out


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "derender"))
def test_batch_derender_matches_vllm(directory: str, path: Path) -> None:
    case = load_case(path)
    response = post(case, case["path"], case["request"])
    assert response.status_code == case["status"], response.text
    got = response.json()
    expected = case["response"]
    if case["status"] != 200:
        assert got["error"]["type"] == expected["error"]["type"]
        return
    got.pop("created")
    expected = {k: v for k, v in expected.items() if k != "created"}
    if case.get("kind") == "completion":
        assert got == expected
        return
    divergence = DIVERGENCES.get((directory, case["name"], "batch"))
    if divergence is not None:
        assert message_final(got["choices"][0]["message"]) == reference_final(
            case, divergence[0], "batch"
        ), divergence[1]
        return
    got["choices"] = [comparable_choice(c) for c in got["choices"]]
    expected["choices"] = [comparable_choice(c) for c in expected["choices"]]
    assert got == expected


def stream_cases() -> list[Any]:
    params = []
    for param in case_params(DIRECTORIES, "derender"):
        directory, path = param.values
        case = load_case(path)
        for chunking in (case.get("stream") or {}).get("chunkings", {}):
            params.append(
                pytest.param(directory, path, chunking, id=f"{directory}/{path.stem}/{chunking}")
            )
    return params


def comparable_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in chunk.items() if k != "created"}
    choices = []
    for choice in out.get("choices") or []:
        choice = dict(choice)
        if "delta" in choice:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if k != "tool_calls"}
        choices.append(choice)
    out["choices"] = choices
    return out


def stream_chunks(case: dict[str, Any], chunking: str) -> list[dict[str, Any]]:
    """Our chunks for one stored chunking (the client loop)."""
    stream = case["stream"]
    state: Any = None
    chunks = []
    for call in stream["chunkings"][chunking]["calls"]:
        body = {
            **stream["request_base"],
            "generate_chunk": call["generate_chunk"],
            "stream_state": state,
        }
        payload = post(case, stream["path"], body).json()
        state = payload["stream_state"]
        chunks.append(payload["chunk"])
    return chunks


@pytest.mark.parametrize(("directory", "path", "chunking"), stream_cases())
def test_streaming_derender_matches_vllm_chunk_by_chunk(
    directory: str, path: Path, chunking: str
) -> None:
    case = load_case(path)
    stream = case["stream"]
    calls = stream["chunkings"][chunking]["calls"]
    state: Any = None
    chunks: list[dict[str, Any]] = []
    divergence = DIVERGENCES.get((directory, case["name"], chunking))
    for call in calls:
        body = {
            **stream["request_base"],
            "generate_chunk": call["generate_chunk"],
            "stream_state": state,
        }
        response = post(case, stream["path"], body)
        assert response.status_code == call["status"], response.text
        if call["status"] != 200:
            assert response.json()["error"]["type"] == call["response"]["error"]["type"]
            return
        payload = response.json()
        state = payload["stream_state"]
        chunks.append(payload["chunk"])
        if divergence is None:
            assert comparable_chunk(payload["chunk"]) == comparable_chunk(call["chunk"])
    if case.get("kind") == "completion":
        return
    expected_shapes = stream_id_shapes([call["chunk"] for call in calls])
    if expected_shapes:
        assert stream_id_shapes(chunks) <= expected_shapes
    if divergence is not None:
        assert accumulate(chunks) == reference_final(case, divergence[0], chunking), divergence[1]
    else:
        assert accumulate(chunks) == stream_final(stream["chunkings"][chunking]["final"])
