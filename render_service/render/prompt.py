"""Prompt text to ids, with vLLM's truncation and context-length rules, and the output budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from render_service.errors import invalid_param
from render_service.model.loading import Model
from render_service.model.tokenizing import SegmentEncoder
from render_service.settings import Settings


@dataclass(frozen=True)
class Prompt:
    """Rendered prompt ids, with char offsets when asked for."""

    token_ids: list[int]
    offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None


class PromptEncoder:
    """Encodes prompt text for one model and checks prompts and budgets against its context."""

    def __init__(self, model: Model, settings: Settings) -> None:
        self.model = model
        self.max_prompt_tokens = settings.max_prompt_tokens
        self.segments = (
            SegmentEncoder(
                model.backend,
                settings.segment_cache_entries,
                max_bytes=settings.segment_cache_bytes,
            )
            if model.backend is not None
            else None
        )

    def encode(
        self,
        text: str,
        add_special_tokens: bool,
        truncate: int | None,
        side: str | None,
        want_offsets: bool,
    ) -> Prompt:
        """The ids of ``text``, truncated as asked (``-1``: to max_model_len), length-checked."""
        offsets: list[tuple[int, int]] | None = None
        if self.segments is None:  # Mistral's tekken: no offsets (vLLM has none either)
            ids = self.model.encode(text, add_special_tokens)
        elif add_special_tokens or want_offsets:
            encoding = self.model.hf_backend.encode(text, add_special_tokens=add_special_tokens)
            ids = list(encoding.ids)
            offsets = [(start, end) for start, end in encoding.offsets] if want_offsets else None
        else:
            ids = self.segments.encode(text)
        return self.finish(ids, offsets, truncate, side)

    def finish(
        self,
        ids: list[int],
        offsets: list[tuple[int, int]] | None,
        truncate: int | None,
        side: str | None,
    ) -> Prompt:
        """Truncate rendered ids as asked (``-1``: to max_model_len) and check their length."""
        if truncate is not None:
            keep = self.model.info.max_model_len if truncate == -1 else truncate
            if keep < len(ids):
                cut = slice(len(ids) - keep, None) if (side or "left") == "left" else slice(0, keep)
                ids = ids[cut]
                offsets = offsets[cut] if offsets is not None else None
        self.check_length(len(ids))
        return Prompt(ids, offsets)

    def close(self) -> None:
        if self.segments is not None:
            self.segments.close()

    def check_length(self, length: int) -> None:
        """A prompt of ``length`` ids must fit --max-prompt-tokens and the model's context."""
        limit = self.model.info.max_model_len
        cap = self.max_prompt_tokens
        if cap is not None and cap < limit and length > cap:
            raise invalid_param(
                f"The prompt has {length} tokens, over this server's limit of {cap} "
                "(--max-prompt-tokens).",
                "input_tokens",
                length,
            )
        if length > limit:
            raise invalid_param(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at "
                f"least {limit + 1} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.",
                "input_tokens",
                limit + 1,
            )

    def check_token_ids(self, ids: list[int], param: str) -> None:
        """Every id of a token-id prompt must be in the vocabulary."""
        vocab = self.model.vocab_size
        for token in ids:
            if token < 0 or token >= vocab:
                raise invalid_param(f"Token id {token} is out of vocabulary", param)

    def max_tokens(
        self, requested: int | None, input_len: int, param: str, clamp: bool = False
    ) -> int:
        """The output budget: the request's, the model's default, and what the context leaves.

        `clamp`: a request above the context length is cut to it instead of refused (vLLM's
        Harmony path skips that check).
        """
        limit = self.model.info.max_model_len
        if requested is not None and requested > limit and not clamp:
            raise invalid_param(
                f"{param}={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param,
                requested,
            )
        candidates = [limit - input_len]
        if requested is not None:
            candidates.append(requested)
        elif "max_tokens" in self.model.info.sampling_defaults:
            candidates.append(int(self.model.info.sampling_defaults["max_tokens"]))
        value = min(candidates)
        if value < 1:
            raise invalid_param(f"max_tokens must be at least 1, got {value}.", "max_tokens", value)
        return value
