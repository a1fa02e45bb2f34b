"""Image render cases of ../shared/golden/qwen2.5-vl: our features decode to vLLM 0.33.0's tensors.

``test_golden_render`` already compares the responses byte for byte; this test decodes both
sides' ``kwargs_data`` and ``mm_metadata`` and compares tensors and field specs, so a failure
says which tensor differs, and it also checks that hashes and placeholders agree.
"""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from render_service.http.cli import parse_settings
from render_service.multimodal.serialize import decode_item
from render_service.protocol.tokenize import TokenizeChatRequest
from render_service.render import Renderer
from render_service.validation import convert
from tests.golden import MODELS, case_files, load_case, needs_shared

pytestmark = needs_shared

CASES = [
    p
    for p in case_files("qwen2.5-vl", "render")
    if p.stem.startswith("image_") and load_case(p)["status"] == 200
]


@cache
def renderer() -> Renderer:
    # vLLM was started inside the models folder; the bare name is the hashed model id.
    with contextlib.chdir(MODELS):
        return Renderer.from_settings(parse_settings(["qwen2.5-vl"]))


def features_of(case: dict[str, Any]) -> dict[str, Any]:
    result = msgspec.to_builtins(renderer().render_chat(case["request"]))
    return result["features"]


def assert_items_equal(ours: str, theirs: str) -> None:
    got, expected = decode_item(ours), decode_item(theirs)
    assert list(got) == list(expected)
    for name in expected:
        assert got[name]["array"].dtype == expected[name]["array"].dtype, name
        assert got[name]["array"].shape == expected[name]["array"].shape, name
        assert np.array_equal(got[name]["array"], expected[name]["array"]), name
        assert got[name]["field"] == expected[name]["field"], name


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_features_match_vllm(path: Path) -> None:
    case = load_case(path)
    expected = case["response"]["features"]
    got = features_of(case)
    assert got["mm_hashes"] == expected["mm_hashes"]
    assert got["mm_placeholders"] == expected["mm_placeholders"]
    if expected["kwargs_data"] is None:
        assert got["kwargs_data"] is None and got["mm_metadata"] is None
        return
    for ours, theirs in zip(
        got["kwargs_data"]["image"], expected["kwargs_data"]["image"], strict=True
    ):
        assert_items_equal(ours, theirs)
    for ours, theirs in zip(
        got["mm_metadata"]["image"], expected["mm_metadata"]["image"], strict=True
    ):
        assert_items_equal(ours, theirs)


def test_the_corpus_has_image_cases() -> None:
    assert len(CASES) >= 9


def test_tokenize_expands_images_like_render() -> None:
    case = load_case(next(p for p in CASES if p.stem == "image_multi_turn"))
    request = convert({"messages": case["request"]["messages"]}, TokenizeChatRequest, "body")
    result = msgspec.to_builtins(renderer().tokenize(request))
    assert result["tokens"] == case["response"]["token_ids"]
