"""Ray Data stages: render and derender as callable classes for ``Dataset.map_batches``.

Each actor loads the model once (``__init__``) and answers whole batches (``__call__``), so a
pipeline shaped like Ray Data's LLM processor (chat template -> tokenize -> engine ->
detokenize) runs its CPU ends here and its engine wherever the GPUs are (docs/library.md).
A request travels as a JSON string column: Arrow would otherwise widen every message to the
union of all messages' keys (adding null ``tool_calls``, ``reasoning``, ...). A row that
fails gets its error in the ``error`` column and never stops the pipeline.

Install with the ``ray`` extra (``pip install 'render-service[ray]'``); this module imports
nothing from Ray itself, so the classes work with any ``map_batches``-like caller.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from render_service.errors import RenderServiceError
from render_service.library import Renderer

__all__ = ["DerenderStage", "RenderStage"]

Batch = dict[str, Any]


def _request(value: Any) -> dict[str, Any]:
    if isinstance(value, (str, bytes)):
        decoded: dict[str, Any] = json.loads(value)
        return decoded
    if isinstance(value, dict):
        return value
    raise TypeError(f"a request is a JSON string or a dict, not {type(value).__name__}")


def _ids(value: Any) -> list[int]:
    """Token ids from a batch cell (a list, or the numpy array Ray hands a list column as)."""
    listed = value.tolist() if hasattr(value, "tolist") else list(value)
    return [int(i) for i in listed]


def _column(batch: Batch, name: str) -> Sequence[Any]:
    if name not in batch:
        raise KeyError(f"the batch has no column {name!r} (columns: {sorted(batch)})")
    column: Sequence[Any] = batch[name]
    return column


class _EarlierError(Exception):
    """The row arrived with an error from an earlier stage."""


class _Stage:
    def __init__(self, model: str, settings: dict[str, Any] | None) -> None:
        self.renderer = Renderer.from_pretrained(model, **(settings or {}))


class RenderStage(_Stage):
    """Chat requests -> prompt token ids.

    Reads ``request_column`` (a chat render body as JSON, or a dict), adds
    ``prompt_token_ids`` and ``error`` (None, or the vLLM error message for that row), and
    ``sampling_params`` (JSON: the request's sampling parameters, for the engine stage).
    """

    def __init__(
        self,
        model: str,
        *,
        request_column: str = "request",
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model, settings)
        self.request_column = request_column

    def __call__(self, batch: Batch) -> Batch:
        ids: list[list[int]] = []
        sampling: list[str | None] = []
        errors: list[str | None] = []
        for value in _column(batch, self.request_column):
            try:
                rendered = self.renderer.render_chat(_request(value))
            except (RenderServiceError, ValueError, TypeError) as exc:
                ids.append([])
                sampling.append(None)
                errors.append(getattr(exc, "message", str(exc)))
                continue
            ids.append(rendered.token_ids)
            sampling.append(msgspec.json.encode(rendered.sampling_params).decode())
            errors.append(None)
        return {**batch, "prompt_token_ids": ids, "sampling_params": sampling, "error": errors}


class DerenderStage(_Stage):
    """Generated token ids -> the OpenAI assistant message, as the HTTP batch derender answers.

    Reads ``request_column`` (the chat request, for its tools and parser options),
    ``prompt_column`` and ``output_column`` (ids); adds ``content``, ``reasoning``,
    ``tool_calls`` (JSON, or None), ``finish_reason`` and ``error``. A ``finish_reason_column``
    (e.g. the engine's "length") is used when the batch has it; a row whose ``error`` an
    earlier stage set keeps that error.
    """

    def __init__(
        self,
        model: str,
        *,
        request_column: str = "request",
        prompt_column: str = "prompt_token_ids",
        output_column: str = "generated_tokens",
        finish_reason_column: str = "finish_reason",
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model, settings)
        self.request_column = request_column
        self.prompt_column = prompt_column
        self.output_column = output_column
        self.finish_reason_column = finish_reason_column

    def __call__(self, batch: Batch) -> Batch:
        requests = _column(batch, self.request_column)
        prompts = _column(batch, self.prompt_column)
        outputs = _column(batch, self.output_column)
        reasons = batch.get(self.finish_reason_column)
        earlier = batch.get("error")  # a row an earlier stage failed keeps its error
        columns: dict[str, list[Any]] = {
            "content": [],
            "reasoning": [],
            "tool_calls": [],
            "finish_reason": [],
            "error": [],
        }
        for row, (request, prompt, output) in enumerate(
            zip(requests, prompts, outputs, strict=True)
        ):
            reason = str(reasons[row]) if reasons is not None and reasons[row] else "stop"
            failed = earlier[row] if earlier is not None else None
            try:
                if failed:
                    raise _EarlierError(str(failed))
                choice = self.renderer.derender_chat(
                    _ids(prompt), _ids(output), _request(request), finish_reason=reason
                )
            except (_EarlierError, RenderServiceError, ValueError, TypeError) as exc:
                for name in ("content", "reasoning", "tool_calls", "finish_reason"):
                    columns[name].append(None)
                columns["error"].append(getattr(exc, "message", str(exc)))
                continue
            message = choice.message
            calls = message.tool_calls
            columns["content"].append(message.content)
            columns["reasoning"].append(message.reasoning)
            columns["tool_calls"].append(
                msgspec.json.encode(calls).decode() if isinstance(calls, list) else None
            )
            columns["finish_reason"].append(choice.finish_reason)
            columns["error"].append(None)
        return {**batch, **columns}
