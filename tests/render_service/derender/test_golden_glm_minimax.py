"""GLM-4.5 and MiniMax-M2.7 (both reasoning modes) against vLLM 0.33.0's golden corpus.

Render: every case equals vLLM's answer. Derender: batch and every stored chunking, chunk by
chunk as in test_golden_derender; where vLLM is chunking-dependent or loses text, the case
sits in DIVERGENCES with its reason, and our answer must equal the named reference.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.golden import case_params, load_case, needs_shared
from tests.render_service.derender import test_golden_derender as derender
from tests.render_service.render import test_golden_render as render

pytestmark = needs_shared

DIRECTORIES = ["glm-4.5", "minimax-m2.7", "minimax-m2.7-reasoning"]

NEWLINE_AFTER_CALL = (
    "leading whitespace of content waits for the next text, whatever the chunking (vLLM's "
    "one-token stream drops a lone newline after a call that bigger chunks keep)"
)
BATCH_IS_STREAM = (
    "batch is the accumulated stream (vLLM's batch strips content around calls, drops text "
    "after a call and the unfinished value of a cut call)"
)
THINK_END_KEPT = (
    "append-think keeps </think> in the content (vLLM's minimax_m2 tool pass drops it once "
    "tools are parsed; its one-token and random chunkings also drop the blank lines after it)"
)

CUT_VALUE = (
    "a stop string inside a value leaves the call as streamed up to the cut, the value "
    "unterminated (vLLM's batch keeps the complete members only)"
)
CALL_IN_THINK_BLOCK = (
    "append-think streams the think block as written, a call in it included (vLLM's batch "
    "alone parses that call)"
)

# (directory, case, mode) -> (reference, reason); mode is a chunking or "batch". References:
# "stream:<chunking>" is vLLM's answer for that chunking; "think_end:<chunking>" is that answer
# with the `</think>` vLLM dropped put back where the model wrote it.
DIVERGENCES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("glm-4.5", "text_after_tool_call", "one_token"): ("stream:whole", NEWLINE_AFTER_CALL),
    ("minimax-m2.7", "tool_call_inside_reasoning", "batch"): ("stream:whole", CALL_IN_THINK_BLOCK),
    ("minimax-m2.7", "stop_string_inside_call", "batch"): ("cut_value:batch", CUT_VALUE),
    ("minimax-m2.7-reasoning", "stop_string_inside_call", "batch"): ("cut_value:batch", CUT_VALUE),
    **{
        (directory, case, "batch"): ("stream:whole", BATCH_IS_STREAM)
        for directory, cases in (
            (
                "glm-4.5",
                (
                    "content_before_tool_call",
                    "include_reasoning_false_tool",
                    "missing_arg_value_close",
                    "text_after_tool_call",
                    "truncated_in_arg_value",
                ),
            ),
            (
                "minimax-m2.7-reasoning",
                (
                    "content_before_tool_call",
                    "include_reasoning_false_tool",
                    "missing_parameter_close",
                    "truncated_second_invoke",
                ),
            ),
        )
        for case in cases
    },
}


THINK_END_ID = 200051  # MiniMax's `</think>`


def divergence(directory: str, case: dict[str, Any], mode: str) -> tuple[str, str] | None:
    """The declared divergence of a case, if any (append-think ones follow one rule)."""
    listed = DIVERGENCES.get((directory, case["name"], mode))
    if listed is not None or directory != "minimax-m2.7":
        return listed
    chat = case["request"].get("chat_request") or {}
    parsed = chat.get("tools") and chat.get("tool_choice") != "none"
    wrote_end = any(THINK_END_ID in out["token_ids"] for out in case["output"])
    if parsed and wrote_end and "stream" in case:
        return "think_end:whole", THINK_END_KEPT
    return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def reference(case: dict[str, Any], ref: str) -> dict[str, Any]:
    """vLLM's answer named by a divergence reference (see DIVERGENCES)."""
    kind, _, chunking = ref.partition(":")
    final = derender.stream_final(case["stream"]["chunkings"][chunking]["final"])
    if kind == "think_end":
        text = case["output"][0]["text"]
        at = len("<think>") + text.index("</think>")
        final["content"] = final["content"][:at] + "</think>" + final["content"][at:]
    return final


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "render"))
def test_render_matches_vllm(directory: str, path: Path) -> None:
    case = load_case(path)
    response = render.send(case)
    expected = case["response"]
    assert response.status_code == case["status"], response.text
    got = response.json()
    if case["status"] != 200:
        if isinstance(expected, dict) and "error" in expected:
            assert got["error"]["type"] == expected["error"]["type"]
            assert got["error"]["code"] == expected["error"]["code"]
            if "validation error" not in expected["error"]["message"]:
                assert got["error"]["message"] == expected["error"]["message"]
        else:
            assert got == expected
        return
    got = render.strip_random(got, case)
    expected = render.strip_random(copy.deepcopy(expected), case)
    assert got == expected


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "derender"))
def test_batch_derender(directory: str, path: Path) -> None:
    case = load_case(path)
    response = derender.post(case, case["path"], case["request"])
    assert response.status_code == case["status"], response.text
    got = response.json()
    expected = case["response"]
    if case["status"] != 200:
        assert got["error"]["type"] == expected["error"]["type"]
        return
    got.pop("created")
    expected = {k: v for k, v in expected.items() if k != "created"}
    declared = divergence(directory, case, "batch")
    if declared is not None and declared[0] == "cut_value:batch":
        mine = derender.message_final(got["choices"][0]["message"])
        want = derender.message_final(expected["choices"][0]["message"])
        [(name, arguments)] = mine.pop("tool_calls")
        [(want_name, want_arguments)] = want.pop("tool_calls")
        if directory == "minimax-m2.7":  # append-think keeps the think block (THINK_END_KEPT)
            want["content"] = "<think>" + case["output"][0]["text"].split("<minimax:tool_call>")[0]
        assert mine == want and name == want_name, declared[1]
        assert arguments.startswith(want_arguments[:-1]) and not _is_json(arguments), declared[1]
        return
    if declared is not None:
        want = reference(case, declared[0])
        assert derender.message_final(got["choices"][0]["message"]) == want, declared[1]
        return
    got["choices"] = [derender.comparable_choice(c) for c in got["choices"]]
    expected["choices"] = [derender.comparable_choice(c) for c in expected["choices"]]
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


@pytest.mark.parametrize(("directory", "path", "chunking"), stream_cases())
def test_streaming_derender(directory: str, path: Path, chunking: str) -> None:
    case = load_case(path)
    stream = case["stream"]
    calls = stream["chunkings"][chunking]["calls"]
    state: Any = None
    chunks: list[dict[str, Any]] = []
    declared = divergence(directory, case, chunking)
    for call in calls:
        body = {
            **stream["request_base"],
            "generate_chunk": call["generate_chunk"],
            "stream_state": state,
        }
        response = derender.post(case, stream["path"], body)
        assert response.status_code == call["status"], response.text
        if call["status"] != 200:
            assert response.json()["error"]["type"] == call["response"]["error"]["type"]
            return
        payload = response.json()
        state = payload["stream_state"]
        chunks.append(payload["chunk"])
        if declared is None:
            assert derender.comparable_chunk(payload["chunk"]) == derender.comparable_chunk(
                call["chunk"]
            )
    if declared is not None:
        assert derender.accumulate(chunks) == reference(case, declared[0]), declared[1]
    else:
        final = stream["chunkings"][chunking]["final"]
        assert derender.accumulate(chunks) == derender.stream_final(final)
