"""The processed-image cache: bounded LRU, and a hit gives exactly what processing gives."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np

from render_service.multimodal.cache import PatchCache, Patches, patch_cache
from render_service.multimodal.pipeline import MediaBatch, MediaPipeline
from render_service.multimodal.qwen2_vl import VisionConfig
from render_service.protocol.chat import ChatCompletionRequest
from render_service.settings import Settings
from tests.media_support import chat_body, data_url, image_bytes

CACHE_GB = 0.0123  # a capacity no other test uses: its cache is this module's alone


def patches(size: int) -> Patches:
    return Patches(rows=np.zeros((size, 1), np.uint8), grid_thw=(1, size, 1), num_tokens=1)


def test_least_recently_used_goes_first_and_bytes_stay_bounded() -> None:
    cache = PatchCache(100)
    for key in "abc":
        cache.put(key, patches(40))
    assert cache.get("a") is None  # evicted for "c"
    assert cache.get("b") is not None  # now the most recent
    cache.put("d", patches(40))
    assert cache.get("c") is None and cache.get("b") is not None
    assert cache.size_bytes == 80
    cache.put("huge", patches(101))
    assert cache.get("huge") is None and cache.size_bytes == 80
    size = cache.size()  # what /metrics reports as render_service_cache_bytes{cache="images"}
    assert (size.name, size.entries, size.bytes) == ("images", 2, 80)


def test_the_pipeline_reports_its_in_process_cache() -> None:
    settings = Settings(model="test-vl", media_executor="thread", mm_processor_cache_gb=CACHE_GB)
    pipe = MediaPipeline("test-vl", VisionConfig(), settings)
    try:
        prepare(
            {"mm_processor_cache_gb": CACHE_GB}, chat_body(data_url(image_bytes(28, 28, seed=41)))
        )
        [size] = pipe.caches()
        assert size == patch_cache(int(CACHE_GB * (1 << 30))).size() and size.bytes > 0
        off = MediaPipeline("test-vl", VisionConfig(), Settings(model="test-vl"))
        assert off.caches() == []  # no budget, no cache
        off.close()
    finally:
        pipe.close()


def prepare(flags: dict[str, Any], body: dict[str, Any]) -> MediaBatch:
    settings = Settings(model="test-vl", media_executor="thread", **flags)
    pipe = MediaPipeline("test-vl", VisionConfig(), settings)
    batch = asyncio.run(pipe.prepare(msgspec.convert(body, ChatCompletionRequest)))
    assert batch is not None
    return batch


def test_a_cached_image_in_another_request_is_what_processing_gives() -> None:
    first = data_url(image_bytes(84, 56, seed=31))
    second = data_url(image_bytes(56, 112, seed=32))
    cached = {"mm_processor_cache_gb": CACHE_GB}
    cache = patch_cache(int(CACHE_GB * (1 << 30)))
    prepare(cached, chat_body(first))
    hits = cache.hits
    # Same image, now second of two: its item must describe this request's batch layout.
    again = prepare(cached, chat_body(second, first))
    assert cache.hits == hits + 1
    assert again == prepare({"mm_processor_cache_gb": 0}, chat_body(second, first))


def test_a_reused_uuid_never_returns_other_pixels() -> None:
    cached = {"mm_processor_cache_gb": CACHE_GB}
    for seed in (41, 42):
        body = chat_body(data_url(image_bytes(56, 56, seed=seed)))
        body["messages"][0]["content"][0]["uuid"] = "same-uuid"
        got = prepare(cached, body)
        assert got == prepare({"mm_processor_cache_gb": 0}, body)
