"""The Ray Data stages on a local two-CPU Ray cluster: a few hundred conversations rendered,
"generated" by a stand-in engine stage, derendered, each row equal to the library's answer.

Runs on the embedded default model; skips when the ``ray`` extra is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from render_service.library import Renderer
from render_service.model.default_model import ensure_default_model

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
ray_data = pytest.importorskip("ray.data", reason="the ray[data] extra is not installed")

from render_service.ray import DerenderStage, RenderStage  # noqa: E402

CONVERSATIONS = 300
# Ray Data's own deprecations (raised inside ray.data) are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def request(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are assistant number {n}."},
        {"role": "user", "content": f"Question {n}: " + "why " * (n % 11)},
    ]
    if n % 3 == 0:
        messages += [
            {"role": "assistant", "content": f"Answer {n}."},
            {"role": "user", "content": "And then?"},
        ]
    if n % 50 == 7:
        messages = []  # a bad row: the render error stays in its row
    return {"messages": messages}


class Engine:
    """Stands in for the GPU stage: "generates" a reply that names the conversation."""

    def __init__(self, model: str) -> None:
        self.renderer = Renderer.from_pretrained(model)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        outputs = []
        for ids in batch["prompt_token_ids"]:
            text = f"Reply to a prompt of {len(ids)} tokens."
            outputs.append(self.renderer.tokenize({"prompt": text}).tokens)
        return {**batch, "generated_tokens": outputs}


def test_render_engine_derender_pipeline(cluster: None) -> None:
    model = str(ensure_default_model())
    rows = [{"request": json.dumps(request(n))} for n in range(CONVERSATIONS)]
    ds = ray_data.from_items(rows, override_num_blocks=4)
    # Three actors share the two CPUs: fractional CPUs, or the later stages never start.
    stage = {"fn_constructor_kwargs": {"model": model}, "num_cpus": 0.5, "concurrency": 1}
    ds = ds.map_batches(RenderStage, **stage)
    ds = ds.map_batches(Engine, **stage)
    ds = ds.map_batches(DerenderStage, **stage)
    results = ds.take_all()
    assert len(results) == CONVERSATIONS
    library = Renderer.from_pretrained(model)
    by_request = {row["request"]: row for row in results}
    for n in range(CONVERSATIONS):
        row = by_request[json.dumps(request(n))]
        if n % 50 == 7:
            assert "empty conversation" in row["error"]
            continue
        expected = library.render_chat(request(n)).token_ids
        assert list(row["prompt_token_ids"]) == expected
        assert row["content"] == f"Reply to a prompt of {len(expected)} tokens."
        assert row["finish_reason"] == "stop"
        assert row["error"] is None
