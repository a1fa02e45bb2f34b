"""Image loading for the multimodal pipeline: URLs, data URLs, local files, and every limit.

URLs are served by a local http.server on 127.0.0.1 (a thread), which the pipeline may fetch
only because these tests allow private addresses; the refusal tests never connect anywhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import pytest

from render_service.errors import InvalidRequest
from render_service.multimodal import work
from render_service.multimodal.pipeline import (
    MediaBatch,
    MediaPipeline,
    Payload,
    _decode_then_finish,
)
from render_service.multimodal.qwen2_vl import VisionConfig
from render_service.protocol.chat import ChatCompletionRequest
from render_service.settings import Settings
from tests.media_support import (
    MediaServer,
    chat_body,
    data_url,
    image_bytes,
    image_part,
    media_server,
    png_bomb,
    truncated_jpeg,
)


def pipeline(**flags: Any) -> MediaPipeline:
    settings = Settings(
        model="test-vl",
        allow_private_media_urls=flags.pop("allow_private_media_urls", True),
        media_fetch_timeout=flags.pop("media_fetch_timeout", 1.0),
        max_media_bytes=flags.pop("max_media_bytes", 1024 * 1024),
        media_executor=flags.pop("media_executor", "thread"),
        **flags,
    )
    return MediaPipeline("test-vl", VisionConfig(), settings)


def prepare(pipe: MediaPipeline, body: dict[str, Any], stream: bool = False) -> MediaBatch | None:
    return asyncio.run(pipe.prepare(msgspec.convert(body, ChatCompletionRequest), stream))


def refused(pipe: MediaPipeline, body: dict[str, Any]) -> InvalidRequest:
    """The 400 a request gets, the same whether its payloads would be streamed or not."""
    errors = []
    for stream in (False, True):
        with pytest.raises(InvalidRequest) as info:
            prepare(pipe, body, stream)
        assert info.value.status == 400
        errors.append((info.value.message, info.value.param))
    assert errors[0] == errors[1]
    return info.value


def streamed(pipe: MediaPipeline, body: dict[str, Any]) -> tuple[MediaBatch, list[bytes]]:
    """A streamed batch and its payloads, read to the end (in prompt order, as a response)."""

    async def run() -> tuple[MediaBatch, list[bytes]]:
        batch = await pipe.prepare(msgspec.convert(body, ChatCompletionRequest), stream=True)
        assert batch is not None and batch.payloads is not None
        payloads = []
        for payload in batch.payloads:
            payloads.append(b"".join([piece async for piece in payload.pieces()]))
            assert len(payloads[-1]) == payload.size
        return batch, payloads

    return asyncio.run(run())


@pytest.mark.parametrize("cache_gb", [0.0, 0.1])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_streamed_payloads_are_the_whole_items(count: int, cache_gb: float) -> None:
    formats = ["JPEG", "PNG", "JPEG", "WEBP"]
    urls = [data_url(image_bytes(300 - 40 * i, 200, formats[i], seed=i)) for i in range(count)]
    pipe = pipeline(mm_processor_cache_gb=cache_gb)
    whole = prepare(pipe, chat_body(*urls))
    for _ in range(2):  # with the cache on, the second time the rows come from it
        batch, payloads = streamed(pipe, chat_body(*urls))
        assert whole is not None and len(payloads) == count
        assert payloads == [item.kwargs_data_base64 for item in whole.items]
        for ours, theirs in zip(batch.items, whole.items, strict=True):
            assert ours.kwargs_data is None
            assert (ours.mm_hash, ours.num_tokens, ours.mm_metadata) == (
                theirs.mm_hash,
                theirs.num_tokens,
                theirs.mm_metadata,
            )
    ids = [1, whole.image_token_id] * count
    assert batch.expand(ids)[0] == whole.expand(ids)[0]


def test_an_image_whose_request_is_gone_is_not_processed() -> None:
    data = image_bytes(300, 200, "JPEG")
    _, grid_h, grid_w = work.header_grid(data, 10**6, VisionConfig())
    job = work.Job(
        data=data,
        model_id="test-vl",
        vision=VisionConfig(),
        background=(255, 255, 255),
        mm_kwargs={},
        io_kwargs={},
        uuid=None,
        max_pixels=10**6,
        slices=[[[0, grid_h * grid_w, None]]],
    )
    sent: list[object] = []

    class Recorder:
        def put(self, piece: object) -> None:
            sent.append(piece)

    gone: Future[work.Decoded] = Future()
    gone.cancel()
    _decode_then_finish(job, gone, Recorder())  # type: ignore[arg-type]
    assert sent == []
    live: Future[work.Decoded] = Future()
    _decode_then_finish(job, live, Recorder())  # type: ignore[arg-type]
    assert live.result().num_tokens == grid_h * grid_w // 4
    assert sent[-1] is None and all(isinstance(piece, bytes) for piece in sent[:-1])


def test_a_payload_that_fails_midway_raises_where_it_is_read() -> None:
    async def run() -> None:
        payload = Payload(10, asyncio.get_running_loop())
        payload.put(b"abc")
        payload.put(RuntimeError("the worker failed"))
        pieces = []
        with pytest.raises(RuntimeError, match="the worker failed"):
            async for piece in payload.pieces():
                pieces.append(piece)
        assert pieces == [b"abc"]

    asyncio.run(run())


@pytest.fixture(scope="module")
def server() -> Iterator[MediaServer]:
    with media_server() as running:
        yield running


@pytest.mark.parametrize("count", [1, 2, 4])
def test_urls_give_the_same_items_as_data_urls(server: MediaServer, count: int) -> None:
    images = [image_bytes(56 + 28 * i, 56, "PNG", seed=i) for i in range(count)]
    urls = [server.add(f"n{count}-{i}.png", data) for i, data in enumerate(images)]
    by_url = prepare(pipeline(), chat_body(*urls))
    by_data = prepare(pipeline(), chat_body(*(data_url(d) for d in images)))
    assert by_url is not None and by_data is not None
    assert by_url == by_data
    assert len(by_url.items) == count
    assert len({item.mm_hash for item in by_url.items}) == count


def test_content_type_that_lies_is_ignored(server: MediaServer) -> None:
    png = image_bytes(56, 56, "PNG", seed=3)
    server.add("liar.png", png)
    as_text = prepare(pipeline(), chat_body(f"{server.base}/as-text/liar.png"))
    as_jpeg_label = prepare(pipeline(), chat_body(data_url(png, "image/jpeg")))
    honest = prepare(pipeline(), chat_body(data_url(png)))
    assert as_text == honest == as_jpeg_label


def test_text_labelled_as_png_is_refused() -> None:
    error = refused(pipeline(), chat_body(data_url(b"hello, not an image")))
    assert "messages[0].content[0]" in error.message


def test_pixel_bomb_is_refused_before_decoding() -> None:
    error = refused(pipeline(), chat_body(data_url(png_bomb())))
    assert "messages[0].content[0]" in error.message
    assert "pixels" in error.message


def test_pixel_limit_is_a_setting() -> None:
    body = chat_body(data_url(image_bytes(300, 200)))
    assert prepare(pipeline(), body) is not None
    refused(pipeline(max_image_pixels=300 * 200 - 1), body)


def test_truncated_jpeg_names_message_and_part() -> None:
    good = data_url(image_bytes(56, 56, "JPEG"), "image/jpeg")
    body = {
        "messages": [
            {"role": "user", "content": [image_part(good), {"type": "text", "text": "a"}]},
            {"role": "assistant", "content": "b"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "c"},
                    image_part(data_url(truncated_jpeg(), "image/jpeg")),
                ],
            },
        ]
    }
    error = refused(pipeline(), body)
    assert error.message.startswith("messages[2].content[1]:")
    assert error.param == "messages.2.content.1"


def test_bad_base64_is_refused() -> None:
    refused(pipeline(), chat_body("data:image/png;base64,!!!notbase64!!!"))


def test_redirects_are_followed_up_to_the_limit(server: MediaServer) -> None:
    server.add("hop.png", image_bytes(56, 56, seed=5))
    assert prepare(pipeline(max_media_redirects=2), chat_body(f"{server.base}/hop/1/hop.png"))
    refused(pipeline(max_media_redirects=2), chat_body(f"{server.base}/hop/2/hop.png"))


def test_redirect_loop_is_refused(server: MediaServer) -> None:
    error = refused(pipeline(), chat_body(f"{server.base}/loop"))
    assert "redirect" in error.message


def test_slow_server_times_out(server: MediaServer) -> None:
    error = refused(pipeline(media_fetch_timeout=0.3), chat_body(f"{server.base}/slow"))
    assert "timed out" in error.message


def test_byte_limit_stops_the_download(server: MediaServer) -> None:
    error = refused(pipeline(max_media_bytes=1024 * 1024), chat_body(f"{server.base}/big"))
    assert "--max-media-bytes" in error.message


def test_http_error_status_is_a_400(server: MediaServer) -> None:
    refused(pipeline(), chat_body(f"{server.base}/img/missing.png"))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/img/private.png",
        "http://localhost:{port}/img/private.png",
        "http://[::1]:{port}/img/private.png",
        "http://10.0.0.1/x.png",
        "http://192.168.1.1/x.png",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0:{port}/img/private.png",
    ],
)
def test_private_addresses_are_refused_without_connecting(server: MediaServer, url: str) -> None:
    server.add("private.png", image_bytes(56, 56))
    before = server.hits
    error = refused(
        pipeline(allow_private_media_urls=False), chat_body(url.format(port=server.port))
    )
    assert "non-public" in error.message
    assert server.hits == before


def test_unsupported_scheme_is_refused() -> None:
    refused(pipeline(), chat_body("ftp://example.com/a.png"))


def test_local_files_only_under_the_allowed_path(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    inside = allowed / "a.png"
    inside.write_bytes(image_bytes(56, 56, seed=9))
    outside = tmp_path / "b.png"
    outside.write_bytes(image_bytes(56, 56, seed=9))
    refused(pipeline(), chat_body(inside.as_uri()))
    pipe = pipeline(allowed_local_media_path=str(allowed))
    batch = prepare(pipe, chat_body(inside.as_uri()))
    assert batch == prepare(pipeline(), chat_body(data_url(inside.read_bytes())))
    refused(pipe, chat_body(outside.as_uri()))
    refused(pipe, chat_body((allowed / ".." / "b.png").as_uri()))


def test_limit_mm_per_prompt() -> None:
    body = chat_body(*(data_url(image_bytes(56, 56, seed=i)) for i in range(3)))
    assert prepare(pipeline(limit_mm_per_prompt={"image": 3}), body) is not None
    error = refused(pipeline(limit_mm_per_prompt={"image": 2}), body)
    assert "At most 2 image" in error.message


def test_request_kwargs_need_trust() -> None:
    body = chat_body(data_url(image_bytes(56, 56)), mm_processor_kwargs={"max_pixels": 3136})
    error = refused(pipeline(), body)
    assert error.param == "mm_processor_kwargs"
    io_body = chat_body(
        data_url(image_bytes(56, 56)),
        media_io_kwargs={"image": {"rgba_background_color": [0, 0, 0]}},
    )
    assert refused(pipeline(), io_body).param == "media_io_kwargs"
    trusted = pipeline(trust_request_mm_kwargs=True)
    assert prepare(trusted, body) is not None
    assert prepare(trusted, io_body) is not None


def test_processor_kwargs_change_the_tokens_and_the_hash() -> None:
    url = data_url(image_bytes(280, 280, seed=11))
    trusted = pipeline(trust_request_mm_kwargs=True)
    plain = prepare(trusted, chat_body(url))
    small = prepare(trusted, chat_body(url, mm_processor_kwargs={"max_pixels": 56 * 56}))
    assert plain is not None and small is not None
    assert small.items[0].num_tokens == 4  # 56x56 pixels = 2x2 merged patches
    assert plain.items[0].num_tokens > small.items[0].num_tokens
    assert plain.items[0].mm_hash != small.items[0].mm_hash


def test_client_uuid_is_the_hash_unless_kwargs_change_the_result() -> None:
    url = data_url(image_bytes(56, 56, seed=12))
    body = chat_body(url)
    body["messages"][0]["content"][0]["uuid"] = "sku-1234"
    batch = prepare(pipeline(trust_request_mm_kwargs=True), body)
    assert batch is not None and batch.items[0].mm_hash == "sku-1234"
    with_kwargs = prepare(
        pipeline(trust_request_mm_kwargs=True),
        {**body, "mm_processor_kwargs": {"max_pixels": 3136}},
    )
    assert with_kwargs is not None and with_kwargs.items[0].mm_hash not in ("sku-1234",)


def test_mm_payload_none_keeps_hashes_drops_tensors() -> None:
    url = data_url(image_bytes(56, 56, seed=13))
    full = prepare(pipeline(), chat_body(url))
    bare = prepare(pipeline(), chat_body(url, mm_payload="none"))
    assert full is not None and bare is not None
    assert bare.items[0].kwargs_data is None and bare.items[0].mm_metadata is None
    assert bare.items[0].mm_hash == full.items[0].mm_hash
    _, features = bare.expand([1, bare.image_token_id, 2])
    assert features["kwargs_data"] is None and features["mm_metadata"] is None


def test_expand_counts_placeholders() -> None:
    batch = prepare(pipeline(), chat_body(data_url(image_bytes(84, 56, seed=14))))
    assert batch is not None
    pad = batch.image_token_id
    ids, features = batch.expand([7, 8, pad, 9])
    length = batch.items[0].num_tokens
    assert ids == [7, 8, *([pad] * length), 9]
    assert features["mm_placeholders"] == {"image": [{"offset": 2, "length": length}]}
    with pytest.raises(InvalidRequest):
        batch.expand([7, 8, 9])
    with pytest.raises(InvalidRequest):
        batch.expand([pad, pad])


def test_process_pool_gives_the_same_items_and_errors() -> None:
    body = chat_body(*(data_url(image_bytes(56 + 28 * i, 84, seed=20 + i)) for i in range(2)))
    in_processes = pipeline(media_executor="process", media_num_workers=2)
    try:
        assert prepare(in_processes, body) == prepare(pipeline(), body)
        error = refused(in_processes, chat_body(data_url(truncated_jpeg(), "image/jpeg")))
        assert error.message.startswith("messages[0].content[0]:")
    finally:
        in_processes.pool.shutdown()


def test_limit_accepts_a_count_object() -> None:
    body = chat_body(*(data_url(image_bytes(56, 56, seed=i)) for i in range(2)))
    refused(pipeline(limit_mm_per_prompt={"image": {"count": 1}}), body)


def test_image_workers_do_not_import_transformers() -> None:
    # A --media-executor process worker imports the work module: it must stay small.
    code = "import sys, render_service.multimodal.work; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.skipif(
    sys.platform != "linux", reason="thread priorities are per thread on Linux only"
)
def test_media_threads_run_below_the_server() -> None:
    seen: dict[str, int] = {}

    def start() -> None:
        work.init_worker()
        thread = threading.get_native_id()
        seen["policy"] = os.sched_getscheduler(thread)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, thread)

    def probe() -> None:  # may this process use the idle class at all (seccomp, say)?
        try:
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
            seen["allowed"] = 1
        except OSError:
            seen["allowed"] = 0

    for target in (probe, start):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen["policy"] == (os.SCHED_IDLE if seen["allowed"] else os.SCHED_OTHER)
    assert seen["nice"] >= work.MEDIA_NICENESS
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER  # caller untouched


# Regression (issue 14): a redirect whose Location is not an http(s) URL made httpx raise
# InvalidURL while it built the next request (even with redirects off), and render answered 500.
@pytest.mark.parametrize(
    "location",
    [
        "data:image/png;base64,iVBORw0KGgo=",
        "mailto:someone@example.com",
        "http:img.png",
        "https://",
        "http://[::1",
        "http://exa mple.com/a.png",
        "javascript:alert(1)",
        "//",
        "ftp://example.com/a.png",
        "file:///etc/passwd",
    ],
)
def test_every_redirect_target_error_is_a_400(server: MediaServer, location: str) -> None:
    url = f"{server.base}/location?{quote(location, safe='')}"
    error = refused(pipeline(), chat_body(url))
    assert error.param == "messages.0.content.0"


def test_a_refused_local_path_does_not_name_the_server_directory(tmp_path: Path) -> None:
    # Regression (issue 14): the error named --allowed-local-media-path's directory.
    allowed = tmp_path / "secret-media-root"
    allowed.mkdir()
    outside = tmp_path / "b.png"
    outside.write_bytes(image_bytes(56, 56, seed=9))
    pipe = pipeline(allowed_local_media_path=str(allowed))
    for url in (outside.as_uri(), (allowed / "missing.png").as_uri(), "file:///etc/passwd"):
        error = refused(pipe, chat_body(url))
        assert str(tmp_path) not in error.message
        assert "secret-media-root" not in error.message
        assert "/etc" not in error.message
