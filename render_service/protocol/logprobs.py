"""Logprobs on the wire: generate's integer-id candidates in, OpenAI's chat and completions shapes out."""

from __future__ import annotations

import msgspec


class GenerateLogProb(msgspec.Struct, kw_only=True, gc=False):
    """One candidate on the generate wire: an integer id, never a decoded string."""

    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogProbsContent(msgspec.Struct, kw_only=True):
    """The sampled token of one position and the engine's candidates (sampled first)."""

    token_id: int
    logprob: float
    rank: int | None = None
    top_logprobs: list[GenerateLogProb] = msgspec.field(default_factory=list)


class GenerateLogProbs(msgspec.Struct, kw_only=True):
    """A generate choice's ``logprobs``: one entry per generated id."""

    content: list[GenerateLogProbsContent] | None = None


class ChatCompletionLogProb(msgspec.Struct, kw_only=True, gc=False):
    """A chat candidate; ``bytes`` is null only for an id outside the vocabulary."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatCompletionLogProbsContent(msgspec.Struct, kw_only=True):
    """A chat position: the sampled token and the kept candidates."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[ChatCompletionLogProb]


class ChatCompletionLogProbs(msgspec.Struct, kw_only=True):
    """A chat choice's ``logprobs``."""

    content: list[ChatCompletionLogProbsContent] | None = None


class CompletionLogProbs(msgspec.Struct, kw_only=True):
    """A completions choice's ``logprobs``: parallel lists, one item per position."""

    text_offset: list[int] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    tokens: list[str] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
