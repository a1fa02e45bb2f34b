"""Logprobs of a derendered choice: generate's integer-id candidates in OpenAI's shapes.

`/inference/v1/generate` sends, per position, the sampled id with every candidate the engine
returned (sampled first, then the top ranks), uncut and undecoded (contract §4.2). Derender
cuts them as the coupled endpoint would (chat: ``top_logprobs``; completions: ``logprobs + 1``;
all for ``-1`` or ``logprob_token_ids``), decodes each kept id on its own and repairs a piece
that decodes to U+FFFD from up to four preceding sampled ids (§5.7).

Streaming carries two small values between chunks: the repair context (the last sampled ids)
and, for completions, the absolute ``text_offset``. A chunk's logprobs never depend on more.
The stop token that derender drops from the text keeps its logprob entry, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from parsers.logprob_text import LOGPROB_CONTEXT_IDS, logprob_context, logprob_token_text
from render_service.caches import ByteLRU
from render_service.protocol.logprobs import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    CompletionLogProbs,
    GenerateLogProb,
    GenerateLogProbsContent,
)

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "TokenTexts",
    "advance_text_offset",
    "chat_logprobs",
    "chat_top_limit",
    "completion_logprobs",
    "completion_top_limit",
]

#: Bytes of single-id texts kept per model (thousands of ids: those a stream keeps meeting).
DEFAULT_CACHE_BYTES = 4 * 1024 * 1024
# An entry's memory: the str object (header plus up to 4 bytes a character), key and links.
_ENTRY_OVERHEAD = 160


class TokenTexts:
    """Per-model decoding for logprobs, built once per model and shared by requests.

    ``decode`` renders ids with special tokens kept (``tokenizer.decode(ids,
    skip_special_tokens=False)``); ``known`` says whether an id is in the vocabulary (the
    model's vocabulary can be larger than the tokenizer's). Single-id texts are cached in an
    LRU bounded by ``cache_bytes``, since every position decodes its sampled id and each kept
    candidate alone.
    """

    __slots__ = ("_decode", "_known", "cache")

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        known: Callable[[int], bool] | None = None,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self._decode = decode
        self._known = known
        self.cache: ByteLRU[int, str] = ByteLRU("token_texts", cache_bytes)

    @classmethod
    def for_tokenizer(
        cls, tokenizer: tokenizers.Tokenizer, *, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> TokenTexts:
        """Texts from a byte-level ``tokenizers.Tokenizer`` (SentencePiece needs its leading
        space restored on single ids, which this does not do)."""

        def decode(ids: Sequence[int]) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=False))

        def known(token_id: int) -> bool:
            return tokenizer.id_to_token(token_id) is not None

        return cls(decode, known, cache_bytes=cache_bytes)

    def __call__(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; a single id comes from the cache."""
        if len(ids) != 1:
            return self._decode(ids)
        token_id = ids[0]
        text = self.cache.get(token_id)
        if text is None:
            text = self._decode([token_id])
            self.cache.put(token_id, text, _ENTRY_OVERHEAD + 4 * len(text))
        return text

    def known(self, token_id: int) -> bool:
        """Whether ``token_id`` has a vocabulary entry."""
        return self._known is None or self._known(token_id)


def chat_top_limit(
    logprobs: bool | None, top_logprobs: int | None, logprob_token_ids: Sequence[int] | None
) -> int | None:
    """How many candidates chat keeps per position, from the chat request (None = all).

    Without a request, or one that does not ask for logprobs, pass ``logprobs=None``: the
    request then says nothing about the cut and every candidate generate sent is kept.
    """
    if not logprobs or logprob_token_ids or top_logprobs == -1:
        return None
    return top_logprobs or 0


def completion_top_limit(
    logprobs: int | None, logprob_token_ids: Sequence[int] | None
) -> int | None:
    """How many candidates completions keeps per position (None = all): ``logprobs + 1``."""
    if logprob_token_ids or logprobs is None or logprobs == -1:
        return None
    return max(logprobs + 1, 0)


def chat_logprobs(
    content: Sequence[GenerateLogProbsContent] | None,
    texts: TokenTexts,
    *,
    top_limit: int | None,
    context_ids: Sequence[int] = (),
    sampled_ids: Sequence[int] | None = None,
) -> tuple[ChatCompletionLogProbs, tuple[int, ...]]:
    """Chat logprobs of one chunk (or a whole choice) and the repair context after it.

    ``context_ids`` is the context carried from the previous chunk (empty at the start).
    ``sampled_ids`` are the chunk's ids, by default the positions' ids; vLLM advances the
    carried context by the chunk's ``token_ids``, which includes a dropped stop token.
    """
    positions = None if content is None else _positions(content, texts, top_limit, context_ids)
    return ChatCompletionLogProbs(content=positions), _next_context(
        content, context_ids, sampled_ids
    )


def completion_logprobs(
    content: Sequence[GenerateLogProbsContent] | None,
    texts: TokenTexts,
    *,
    top_limit: int | None,
    context_ids: Sequence[int] = (),
    text_offset: int = 0,
    sampled_ids: Sequence[int] | None = None,
) -> tuple[CompletionLogProbs, tuple[int, ...]]:
    """Completions logprobs of one chunk and the repair context after it.

    ``text_offset`` is where this chunk's first token starts in the choice's text so far
    (0 in batch; the carried offset in a stream). Offsets then advance by token length.
    A position whose generate entry lists no candidates gets ``null`` in ``top_logprobs``.
    """
    next_context = _next_context(content, context_ids, sampled_ids)
    if content is None:
        return CompletionLogProbs(), next_context
    offsets: list[int] = []
    logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    offset = text_offset
    for entry, position in zip(
        content, _positions(content, texts, top_limit, context_ids), strict=True
    ):
        offsets.append(offset)
        logprobs.append(position.logprob)
        tokens.append(position.token)
        tops.append(
            {top.token: top.logprob for top in position.top_logprobs}
            if entry.top_logprobs
            else None
        )
        offset += len(position.token)
    result = CompletionLogProbs(
        text_offset=offsets, token_logprobs=logprobs, tokens=tokens, top_logprobs=tops
    )
    return result, next_context


def advance_text_offset(text_offset: int, logprobs: CompletionLogProbs | None, text: str) -> int:
    """The completions ``text_offset`` to carry to the next chunk.

    It follows the token texts when the chunk had positions, which can differ from the
    emitted ``text`` (special tokens skipped, a held-back partial character); otherwise the
    emitted text.
    """
    if logprobs is not None and logprobs.tokens:
        return logprobs.text_offset[-1] + len(logprobs.tokens[-1])
    return text_offset + len(text)


def _positions(
    content: Sequence[GenerateLogProbsContent],
    texts: TokenTexts,
    top_limit: int | None,
    context_ids: Sequence[int],
) -> list[ChatCompletionLogProbsContent]:
    """Decode each position with the sampled ids before it as repair context."""
    context = tuple(context_ids)
    positions: list[ChatCompletionLogProbsContent] = []
    for entry in content:
        kept = entry.top_logprobs if top_limit is None else entry.top_logprobs[:top_limit]
        token, token_bytes = _token(texts, entry.token_id, context)
        positions.append(
            ChatCompletionLogProbsContent(
                token=token,
                logprob=entry.logprob,
                bytes=token_bytes,
                top_logprobs=[_candidate(texts, top, context) for top in kept],
            )
        )
        context = logprob_context(context, (entry.token_id,))
    return positions


def _candidate(
    texts: TokenTexts, top: GenerateLogProb, context: Sequence[int]
) -> ChatCompletionLogProb:
    token, token_bytes = _token(texts, top.token_id, context)
    return ChatCompletionLogProb(token=token, logprob=top.logprob, bytes=token_bytes)


def _token(
    texts: TokenTexts, token_id: int, context: Sequence[int]
) -> tuple[str, list[int] | None]:
    """Text and UTF-8 bytes of one id; an id outside the vocabulary is ``("", None)``."""
    if not texts.known(token_id):
        return "", None
    text = logprob_token_text(texts, token_id, context)
    return text, list(text.encode("utf-8", errors="replace"))


def _next_context(
    content: Sequence[GenerateLogProbsContent] | None,
    context_ids: Sequence[int],
    sampled_ids: Sequence[int] | None,
) -> tuple[int, ...]:
    if sampled_ids is None:
        # Only the tail can reach the next chunk's context.
        sampled_ids = [entry.token_id for entry in (content or ())[-LOGPROB_CONTEXT_IDS:]]
    return logprob_context(context_ids, sampled_ids)
