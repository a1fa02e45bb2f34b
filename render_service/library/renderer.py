"""``Renderer``: the render path and the derender path of one model, in one object.

``Renderer`` here is the render path (``render_service.render.Renderer``: render, tokenize,
extend, loss masks) plus this model's derender path with the same parser flags, so generated
ids come back as OpenAI messages without the HTTP layer.
"""

from __future__ import annotations

from typing import Any

from render_service.derender.derenderer import Derenderer, build_derenderer
from render_service.derender.inprocess import ChatStream, derender_chat
from render_service.model.loading import Model
from render_service.protocol.chat import ChatCompletionRequest, ChatCompletionResponseChoice
from render_service.protocol.logprobs import GenerateLogProbs
from render_service.render.renderer import Renderer as RenderPath
from render_service.settings import Settings


class Renderer(RenderPath):
    """Renders requests and derenders generated ids for one model, as the HTTP service does."""

    def __init__(self, model: Model, settings: Settings) -> None:
        super().__init__(model, settings)
        self._derenderer: Derenderer | None = None

    @property
    def derenderer(self) -> Derenderer:
        """This model's derender path with the same parser flags (built on first use)."""
        if self._derenderer is None:
            self._derenderer = build_derenderer(self.model, self.parsing, self.settings)
        return self._derenderer

    def derender_chat(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        request: ChatCompletionRequest | dict[str, Any] | None,
        *,
        finish_reason: str | None = "stop",
        stop_reason: int | str | None = None,
        logprobs: GenerateLogProbs | dict[str, Any] | None = None,
        index: int = 0,
    ) -> ChatCompletionResponseChoice:
        """Generated ids -> the OpenAI choice (message with reasoning, content and tool_calls,
        finish_reason, logprobs when given), exactly what the HTTP batch derender answers."""
        return derender_chat(
            self.derenderer,
            prompt_ids,
            output_ids,
            request,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            logprobs=logprobs,
            index=index,
        )

    def chat_stream(
        self,
        request: ChatCompletionRequest | dict[str, Any] | None,
        prompt_ids: list[int] | None,
        *,
        state: str | None = None,
    ) -> ChatStream:
        """A streaming parser for one generation: ``feed(ids)`` gives each delta; ``state`` is
        the HTTP stream state, to checkpoint and resume with ``state=``."""
        return ChatStream(self.derenderer, request, prompt_ids, state)
