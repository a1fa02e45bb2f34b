"""Text of a logprob token, repaired where a byte-level piece decodes to U+FFFD.

A token that holds only part of a UTF-8 character decodes alone to U+FFFD. vLLM 0.33's
derender (`_correct_decoded_token`) then decodes it after up to four preceding sampled ids
and keeps what the token adds to them; the derender layer carries those ids between chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["LOGPROB_CONTEXT_IDS", "logprob_context", "logprob_token_text"]

#: Sampled ids kept as repair context (vLLM's `logprob_context_token_ids`, max_length=4).
LOGPROB_CONTEXT_IDS = 4

_REPLACEMENT = "\ufffd"


def logprob_token_text(
    decode: Callable[[Sequence[int]], str], token_id: int, context_ids: Sequence[int]
) -> str:
    """The text shown for ``token_id`` in logprobs, given the sampled ids before it.

    ``decode`` renders ids as ``tokenizer.decode(ids)`` with special tokens kept; for
    SentencePiece tokenizers the caller's single-id decode must keep the leading space.
    A piece that still ends in U+FFFD with every context length comes out as ``""``.
    """
    alone = decode([token_id])
    if not alone.endswith(_REPLACEMENT):
        return alone
    context = list(context_ids[-LOGPROB_CONTEXT_IDS:])
    for size in range(1, len(context) + 1):
        before = context[-size:]
        joined = decode([*before, token_id])
        if joined.endswith(_REPLACEMENT):
            continue
        # Context ids that are themselves cut characters are not text of their own: the
        # repaired character starts in them, so it belongs to this token.
        clean = len(before)
        while clean > 0 and decode([before[clean - 1]]).endswith(_REPLACEMENT):
            clean -= 1
        prefix = decode(before[:clean]) if clean else ""
        if joined.startswith(prefix):
            return joined[len(prefix) :]
        return joined[_common_prefix_length(prefix, joined) :]
    return ""


def logprob_context(context_ids: Sequence[int], sampled_ids: Sequence[int]) -> tuple[int, ...]:
    """The repair context after ``sampled_ids``: the last few sampled ids."""
    return tuple([*context_ids, *sampled_ids][-LOGPROB_CONTEXT_IDS:])


def _common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
