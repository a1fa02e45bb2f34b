"""A real server with images: bad images get 400s naming the part, none crashes the server, and
text renders sent at the same time still answer (image work has its own pool)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.golden import MODELS, needs_shared
from tests.integration.server import RunningServer, running_server
from tests.media_support import (
    MediaServer,
    chat_body,
    data_url,
    image_bytes,
    media_server,
    png_bomb,
    truncated_jpeg,
)

pytestmark = needs_shared

CHAT = "/v1/chat/completions/render"
TEXT = {"messages": [{"role": "user", "content": "Hello there"}]}


@pytest.fixture(scope="module")
def images() -> Iterator[MediaServer]:
    with media_server() as server:
        yield server


def serve(tmp_path: Path, *flags: str) -> contextlib.AbstractContextManager[RunningServer]:
    argv = [str(MODELS / "qwen2.5-vl"), "--served-model-name", "qwen2.5-vl", *flags]
    return running_server(argv, tmp_path)


def post(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    with server.client() as client:
        return client.post(CHAT, json=body)


def test_bad_images_and_text_at_the_same_time(images: MediaServer, tmp_path: Path) -> None:
    good = [images.add(f"good{i}.png", image_bytes(1280, 720, seed=i)) for i in range(4)]
    bad = {
        "bomb": chat_body(images.add("bomb.png", png_bomb())),
        "truncated": chat_body(images.add("cut.jpg", truncated_jpeg())),
        "loop": chat_body(f"{images.base}/loop"),
        "slow": chat_body(f"{images.base}/slow"),
        "bomb_data_url": chat_body(data_url(png_bomb())),
        "not_image": chat_body(data_url(b"plain text")),
    }
    # /slow answers after 3 s; 2 s leaves the good images' fetches room on a loaded machine
    # (0.5 s timed them out in a CI run at load ~10).
    with (
        serve(tmp_path, "--allow-private-media-urls", "--media-fetch-timeout", "2") as server,
        ThreadPoolExecutor(max_workers=8) as pool,
    ):
        image_jobs = {name: pool.submit(post, server, body) for name, body in bad.items()}
        image_jobs["four_good"] = pool.submit(post, server, chat_body(*good))
        text_jobs = [pool.submit(post, server, TEXT) for _ in range(20)]
        for job in text_jobs:
            response = job.result()
            assert response.status_code == 200, response.text
            assert response.json()["features"] is None
        for name in bad:
            response = image_jobs[name].result()
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["message"].startswith("messages[0].content[0]:")
        four = image_jobs["four_good"].result()
        assert four.status_code == 200, four.text
        features = four.json()["features"]
        assert len(features["mm_hashes"]["image"]) == 4
        assert len(features["kwargs_data"]["image"]) == 4
        assert server.alive()
        assert post(server, TEXT).status_code == 200


def test_private_urls_refused_by_default(images: MediaServer, tmp_path: Path) -> None:
    url = images.add("private.png", image_bytes(56, 56))
    hits = images.hits
    with serve(tmp_path) as server:
        response = post(server, chat_body(url))
        assert response.status_code == 400
        assert "non-public" in response.json()["error"]["message"]
        assert images.hits == hits
        assert post(server, TEXT).status_code == 200
        assert server.alive()


def test_tokenize_with_images_counts_what_render_returns(tmp_path: Path) -> None:
    body = chat_body(
        data_url(image_bytes(84, 56, seed=51)), data_url(image_bytes(56, 112, seed=52))
    )
    with serve(tmp_path) as server, server.client() as client:
        rendered = client.post(CHAT, json=body)
        counted = client.post("/tokenize", json=body)
        bad = client.post("/tokenize", json=chat_body("data:image/png;base64,!!"))
    assert rendered.status_code == 200 and counted.status_code == 200
    assert counted.json()["tokens"] == rendered.json()["token_ids"]
    assert counted.json()["count"] == len(rendered.json()["token_ids"])
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "messages[0].content[0]: Non-base64 digit found"
