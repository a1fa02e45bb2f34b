"""Incremental detokenizer whose whole state is a short window of token ids.

This is the prefix/read-offset algorithm that vLLM 0.33's streaming derender runs
(`detokenize_incrementally`, seeded from the prompt tail), rewritten over a ``decode``
callable so that ``parsers/`` never imports a tokenizer library. Each new id is decoded
together with a few ids before it, so that decoders which look at neighbours (SentencePiece's
leading space, byte-level BPE characters split over several tokens) render it as a one-shot
decode would; text ending in U+FFFD is held back because the next id may complete the
character.

The state carries only the ids since the last emitted boundary, so it stays a few ids long
however long the stream is. Where vLLM would hold text back without limit (a run of ids that
keeps the text ending in U+FFFD, or that decodes to nothing), the window is flushed after
``MAX_HELD_IDS`` ids at a boundary that later ids can no longer change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

__all__ = ["MAX_HELD_IDS", "PROMPT_SEED_IDS", "DetokState", "Detokenizer"]

#: Ids of the prompt tail that seed the window (vLLM: initial offset 5, plus 2 more).
PROMPT_SEED_IDS = 7
#: Ids of the seed that are decoded as context before the first output id (vLLM's offset 5).
PROMPT_CONTEXT_IDS = 5
#: Held-back ids after which the window is flushed (vLLM holds back without limit).
MAX_HELD_IDS = 16
#: Ids kept back by a forced flush: a UTF-8 character needs at most three more bytes and a
#: byte-level token carries at least one, so text before them cannot change any more.
_FLUSH_KEEP_IDS = 3

_REPLACEMENT = "\ufffd"

Decode = Callable[[Sequence[int]], str]


class DetokState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Where an incremental decode stands: the live window of ids, nothing else.

    ``window[:read_offset]`` was already emitted and is decoded again only as context;
    ``window[read_offset:]`` is held back. The window always starts at vLLM's prefix offset.
    """

    window: tuple[int, ...] = ()
    read_offset: int = 0


@dataclass(frozen=True, slots=True)
class Detokenizer:
    """Configuration of an incremental decode: a decode callable and the tokenizer's facts.

    ``decode`` must render ids as ``tokenizer.decode(ids, skip_special_tokens=False)`` does
    (special ids are removed here when ``skip_special_tokens`` is set). To match vLLM's
    streaming path, ``special_ids`` should be transformers' ``all_special_ids``.
    ``spaces_between_special_tokens`` only changes vLLM's output for slow (Python)
    tokenizers; with the fast tokenizers we load it has no effect, and none here.
    ``vocab_size``, when given, makes ids outside the vocabulary decode to nothing, as vLLM does.
    """

    decode: Decode
    special_ids: frozenset[int]
    skip_special_tokens: bool
    spaces_between_special_tokens: bool = True
    vocab_size: int | None = None

    def start(self, prompt_token_ids: Sequence[int]) -> DetokState:
        """Seed a stream from the tail of its prompt (empty for an unseeded stream)."""
        tail = self._kept(prompt_token_ids[-PROMPT_SEED_IDS:])
        # A prompt that stops inside a character would glue its bytes to the first output
        # token; drop such a tail so the output decodes as it would on its own.
        while tail and self.decode(tail).endswith(_REPLACEMENT):
            tail = tail[:-1]
        window = tuple(tail[-PROMPT_CONTEXT_IDS:])
        return DetokState(window=window, read_offset=len(window))

    def step(self, state: DetokState, new_ids: Sequence[int]) -> tuple[DetokState, str]:
        """Feed output ids; return the new state and the text they complete."""
        if len(new_ids) == 1 and self._is_kept(new_ids[0]):  # a streamed chunk, mostly
            one, read, text = self._advance((*state.window, new_ids[0]), state.read_offset)
            return DetokState(window=one, read_offset=read), text
        window = state.window
        read = state.read_offset
        pieces: list[str] = []
        for token_id in self._kept(new_ids):
            window, read, text = self._advance((*window, token_id), read)
            pieces.append(text)
        return DetokState(window=window, read_offset=read), "".join(pieces)

    def finish(self, state: DetokState) -> tuple[DetokState, str]:
        """Flush held-back text as a one-shot decode renders it (a cut character is U+FFFD)."""
        window = state.window
        read = state.read_offset
        if read == len(window):
            return state, ""
        prefix_text = self.decode(window[:read])
        full_text = self.decode(window)
        text = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        return DetokState(window=window[read:], read_offset=len(window) - read), text

    def _kept(self, ids: Sequence[int]) -> list[int]:
        """Drop the ids vLLM renders as nothing: skipped specials and ids outside the vocab."""
        skipped = self.special_ids if self.skip_special_tokens else frozenset()
        size = self.vocab_size
        return [i for i in ids if i not in skipped and (size is None or 0 <= i < size)]

    def _is_kept(self, token_id: int) -> bool:
        """``_kept`` of one id."""
        if self.skip_special_tokens and token_id in self.special_ids:
            return False
        size = self.vocab_size
        return size is None or 0 <= token_id < size

    def _advance(self, window: tuple[int, ...], read: int) -> tuple[tuple[int, ...], int, str]:
        """One step of vLLM's algorithm on a window that starts at the prefix offset.

        On emission the old read offset becomes the prefix offset, so the window is cut there:
        what lies before it is never decoded again. Windows are tuples: the state keeps one, and
        decode callables take them without a copy.
        """
        prefix_text = self.decode(window[:read])
        full_text = self.decode(window)
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT):
            return window[read:], len(window) - read, full_text[len(prefix_text) :]
        if len(window) - read <= MAX_HELD_IDS:
            return window, read, ""
        boundary, text = self._flush_point(window, read, prefix_text, full_text)
        return window[read:], boundary - read, text

    def _flush_point(
        self, window: tuple[int, ...], read: int, prefix_text: str, full_text: str
    ) -> tuple[int, str]:
        """The latest boundary whose text later ids cannot change, and the text up to it."""
        for boundary in range(len(window) - _FLUSH_KEEP_IDS, read, -1):
            text = self.decode(window[:boundary])
            if full_text.startswith(text) and text.startswith(prefix_text):
                return boundary, text[len(prefix_text) :]
        # Only reached when decoding is not prefix-stable; stop holding the run back.
        return len(window), full_text[len(prefix_text) :]
