"""GLM-4.5 and MiniMax-M2.7 (both reasoning modes) against vLLM 0.33.0's golden corpus.

Render: every case equals vLLM's answer. Derender: batch and every stored chunking, chunk by
chunk as in test_golden_derender; where vLLM is chunking-dependent or loses text, the case
sits in DIVERGENCES with its reason, and our answer must equal the named reference.
"""

from __future__ import annotations

import copy
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
TEXT_AFTER_CALL = (
    "batch keeps the text after a call, stripped as content beside calls is (vLLM's batch "
    "drops it; its stream sends it)"
)
THINK_END_KEPT = (
    "append-think keeps </think> in the content (vLLM's minimax_m2 tool pass drops it once "
    "tools are parsed; its one-token and random chunkings also drop the blank lines after it)"
)
CALL_IN_THINK_BLOCK = (
    "append-think streams the think block as written, a call in it included (vLLM's batch "
    "alone parses that call)"
)
MARKUP_WITHOUT_CALL = (
    "append-think drops block markup that yields no call in batch as in streaming (vLLM's batch "
    "keeps it as content)"
)
PROSE_INVOKE = (
    "`<invoke name=` typed in the content opens no call when the function is unknown: it and the "
    "text after it stay content, streamed as vLLM's batch keeps them (vLLM's stream drops them)"
)

# (directory, case, mode) -> (reference, reason); mode is a chunking or "batch". References:
# "batch" is vLLM's batch answer; "stream:<chunking>" is vLLM's answer for that chunking; "think_end:<chunking>" is that answer
# with the `</think>` vLLM dropped put back where the model wrote it; "think_end:batch" is
# vLLM's batch answer with that `</think>` put back. A stream reference for "batch" is shaped
# by the batch rule (content beside calls stripped, whitespace-only content null).
DIVERGENCES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("glm-4.5", "text_after_tool_call", "one_token"): ("stream:whole", NEWLINE_AFTER_CALL),
    ("glm-4.5", "text_after_tool_call", "batch"): ("stream:whole", TEXT_AFTER_CALL),
    ("minimax-m2.7", "text_after_tool_call", "batch"): ("think_end:whole", TEXT_AFTER_CALL),
    ("minimax-m2.7", "tool_call_inside_reasoning", "batch"): ("stream:whole", CALL_IN_THINK_BLOCK),
    **{
        ("minimax-m2.7", "literal_tool_call_in_prose", chunking): ("batch", PROSE_INVOKE)
        for chunking in ("one_token", "random_1_5", "whole")
    },
}


THINK_END_ID = 200051  # MiniMax's `</think>`
BLOCK_ID = 200052  # MiniMax's `<minimax:tool_call>`
CALL_MARKUP = ("<minimax:tool_call>", "<invoke")


def divergence(directory: str, case: dict[str, Any], mode: str) -> tuple[str, str] | None:
    """The declared divergence of a case, if any (append-think ones follow one rule)."""
    listed = DIVERGENCES.get((directory, case["name"], mode))
    if listed is not None or directory != "minimax-m2.7":
        return listed
    chat = case["request"].get("chat_request") or {}
    parsed = chat.get("tools") and chat.get("tool_choice") != "none"
    wrote_end = any(THINK_END_ID in out["token_ids"] for out in case["output"])
    if not (parsed and wrote_end):
        return None
    if mode != "batch":
        return "think_end:whole", THINK_END_KEPT
    if case["response"]["choices"][0]["message"].get("tool_calls"):
        return "think_end:batch", THINK_END_KEPT
    if not any(BLOCK_ID in out["token_ids"] for out in case["output"]):
        return None  # no call block: what was written is content, as in vLLM's batch
    return "think_end:whole", MARKUP_WITHOUT_CALL


def batch_shaped(final: dict[str, Any]) -> dict[str, Any]:
    """A streamed answer as the batch rule shapes an engine family's content beside calls."""
    content = final["content"]
    if final["tool_calls"] and content is not None:
        final["content"] = content.strip() or None
    return final


def think_end_batch(case: dict[str, Any]) -> dict[str, Any]:
    """vLLM's batch answer with the `</think>` it dropped kept: the content before the calls."""
    final = derender.message_final(case["response"]["choices"][0]["message"])
    text = case["output"][0]["text"]
    cut = min(text.index(mark) for mark in CALL_MARKUP if mark in text)
    kept = ("<think>" + text[:cut]).strip()
    # vLLM's content is that text without the `</think>`: the only difference.
    assert kept.replace("</think>", "", 1).strip() == final["content"]
    final["content"] = kept
    return final


def reference(case: dict[str, Any], ref: str, mode: str) -> dict[str, Any]:
    """vLLM's answer named by a divergence reference (see DIVERGENCES)."""
    kind, _, chunking = ref.partition(":")
    if kind == "batch":
        return derender.message_final(case["response"]["choices"][0]["message"])
    if kind == "think_end" and chunking == "batch":
        return think_end_batch(case)
    final = derender.stream_final(case["stream"]["chunkings"][chunking]["final"])
    if kind == "think_end":
        text = case["output"][0]["text"]
        at = len("<think>") + text.index("</think>")
        final["content"] = final["content"][:at] + "</think>" + final["content"][at:]
    return batch_shaped(final) if mode == "batch" else final


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
    if declared is not None:
        want = reference(case, declared[0], "batch")
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
        assert derender.accumulate(chunks) == reference(case, declared[0], chunking), declared[1]
    else:
        final = stream["chunkings"][chunking]["final"]
        assert derender.accumulate(chunks) == derender.stream_final(final)
