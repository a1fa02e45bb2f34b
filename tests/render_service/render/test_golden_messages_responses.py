"""/v1/messages/render and /v1/responses/render give vLLM 0.33.0's answers for the golden corpus.

Compared: status, and for a 200 the whole GenerateRequest (the random request id aside); for an
error its type and param, and its message too unless it is a schema error (vLLM prints pydantic's
list of union-member errors there; ours name the field). Where vLLM fails with a 500, the case is
in DIVERGENCES with our answer's status and the reason (docs/compat.md).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.golden import case_params, load_case, needs_shared
from tests.render_service.render.test_golden_render import send

pytestmark = needs_shared

DIRECTORIES = ["qwen3", "llama-3.1-instruct", "gpt-oss"]

DIVERGENCES: dict[tuple[str, str, str], tuple[int, str]] = {
    ("gpt-oss", "responses", "bad_function_call_output_no_call_id"): (
        200,
        "vLLM's Harmony Responses path raises KeyError('call_id') (500); it renders as qwen3 and "
        "llama render it (vLLM accepts the item there)",
    ),
}


def check(case: dict[str, Any], directory: str, api: str) -> None:
    response = send(case)
    divergence = DIVERGENCES.get((directory, api, case["name"]))
    if divergence is not None:
        assert case["status"] >= 500, "vLLM answers this case now: drop the divergence"
        assert response.status_code == divergence[0], response.text
        return
    assert response.status_code == case["status"], response.text
    got, expected = response.json(), copy.deepcopy(case["response"])
    if case["status"] != 200:
        error, want = got["error"], expected["error"]
        assert (error["type"], error["param"], error["code"]) == (
            want["type"],
            want["param"],
            want["code"],
        )
        if want["type"] != "Bad Request":
            assert error["message"] == want["message"]
        return
    if "$.response.request_id" in case.get("nondeterministic_fields", []):
        got.pop("request_id")
        expected.pop("request_id")
    assert got == expected


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "messages"))
def test_messages_render_matches_vllm(directory: str, path: Path) -> None:
    check(load_case(path), directory, "messages")


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "responses"))
def test_responses_render_matches_vllm(directory: str, path: Path) -> None:
    check(load_case(path), directory, "responses")
