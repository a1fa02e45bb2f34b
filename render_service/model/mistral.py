"""Mistral tokenizer mode (`--tokenizer-mode mistral`): tekken and Mistral's request format.

vLLM 0.33 serves Mistral models in this mode through mistral-common: prompts are encoded from
the chat request itself (`ChatCompletionRequest.from_openai` then `encode_chat_completion`,
with mistral-common's validation in "test" mode), not through a chat template, and text is
decoded by the tekken tokenizer. This module does the same with the same package (an optional
dependency, `pip install 'render-service[mistral]'`), and reproduces the three ways vLLM turns
tekken ids into text:

* `decode` (`/detokenize`, logprob tokens): special tokens spelled out (or skipped), runs of
  ordinary tokens decoded as UTF-8 with U+FFFD for broken bytes.
* `stream_decoder(skip_special_tokens=False)` (chat derender with a parser): each token's own
  piece, so a character split over byte tokens comes out as one U+FFFD per piece; control
  tokens other than `[TOOL_CALLS]` are dropped.
* `stream_decoder(skip_special_tokens=True)` (completions): the same tokens kept, decoded
  together as UTF-8.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "TEKKEN_FILE",
    "MistralTokenizer",
    "MistralTokenizerError",
    "has_tekken",
]

#: The tokenizer file of a Mistral model directory that this mode reads.
TEKKEN_FILE = "tekken.json"
#: Control tokens vLLM's Mistral detokenizer keeps in the text (the parser needs them).
_KEPT_CONTROL = ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")
#: vLLM truncates longer tool-call ids in the history to their last 9 characters.
_TOOL_CALL_ID_LENGTH = 9


class MistralTokenizerError(ValueError):
    """mistral-common refused the request (its message is vLLM's 400 message)."""


def has_tekken(directory: Path) -> bool:
    """Whether a model directory ships a tekken tokenizer."""
    return (directory / TEKKEN_FILE).is_file()


class MistralTokenizer:
    """A tekken tokenizer and Mistral's chat encoder; immutable after loading, thread-safe."""

    def __init__(self, mistral: Any) -> None:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        self._mistral = mistral
        tekken = mistral.instruct_tokenizer.tokenizer
        self._tekken = tekken
        self._keep = SpecialTokenPolicy.KEEP
        self.version = str(tekken.version.value)
        self.num_special_tokens: int = tekken.num_special_tokens
        self.vocab_size: int = tekken.n_words
        self.bos_token_id: int = tekken.bos_id
        self.eos_token_id: int = tekken.eos_id
        self.special_texts: tuple[str, ...] = tuple(
            tekken.id_to_piece(i) for i in range(self.num_special_tokens)
        )
        self.token_bytes: tuple[bytes, ...] = tuple(
            self.special_texts[i].encode()
            if i < self.num_special_tokens
            else tekken.id_to_byte_piece(i)
            for i in range(self.vocab_size)
        )
        self.pieces: tuple[str, ...] = tuple(b.decode("utf-8", "replace") for b in self.token_bytes)
        kept = {self.special_texts.index(t) for t in _KEPT_CONTROL if t in self.special_texts}
        #: Control ids the stream decoders drop (all but `[TOOL_CALLS]` and friends).
        self.dropped_ids: frozenset[int] = frozenset(range(self.num_special_tokens)) - kept

    @classmethod
    def from_directory(cls, directory: Path) -> MistralTokenizer:
        """Load `tekken.json` of a model directory (mistral-common's "test" validation)."""
        try:
            from mistral_common.protocol.instruct.validator import ValidationMode
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as Loader
        except ImportError as exc:
            raise RuntimeError(
                "--tokenizer-mode mistral needs mistral-common: "
                "pip install 'render-service[mistral]'"
            ) from exc
        path = directory / TEKKEN_FILE
        if not path.is_file():
            raise FileNotFoundError(f"--tokenizer-mode mistral: {path} does not exist")
        return cls(Loader.from_file(str(path), mode=ValidationMode.test))

    @property
    def special_ids(self) -> frozenset[int]:
        """Every control token id (vLLM's `all_special_ids`)."""
        return frozenset(range(self.num_special_tokens))

    def control_tokens(self) -> dict[str, int]:
        """Control token spellings and ids, for the parsers' marker lookup."""
        return {text: i for i, text in enumerate(self.special_texts)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; `add_special_tokens` prepends BOS (tekken never makes control tokens)."""
        ids: list[int] = self._tekken.encode(text, bos=add_special_tokens, eos=False)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` as vLLM's `tokenizer.decode` gives it (ids must be in the vocabulary)."""
        special = self.num_special_tokens
        out: list[str] = []
        run: list[bytes] = []
        for token_id in ids:
            if token_id < special:
                if run:
                    out.append(b"".join(run).decode("utf-8", "replace"))
                    run = []
                if not skip_special_tokens:
                    out.append(self.special_texts[token_id])
            else:
                run.append(self.token_bytes[token_id])
        if run:
            out.append(b"".join(run).decode("utf-8", "replace"))
        return "".join(out)

    def piece(self, token_id: int) -> str:
        """The token's own text (`convert_ids_to_tokens`, `/tokenize`'s `token_strs`)."""
        return self.pieces[token_id]

    def stream_decoder(self, skip_special_tokens: bool) -> Callable[[Sequence[int]], str]:
        """A decode callable for `parsers.Detokenizer` that renders ids as vLLM's stream does."""
        dropped = self.dropped_ids
        if not skip_special_tokens:
            pieces = self.pieces

            def by_piece(ids: Sequence[int]) -> str:
                return "".join([pieces[i] for i in ids if i not in dropped])

            return by_piece
        token_bytes = self.token_bytes
        special = self.num_special_tokens

        def as_utf8(ids: Sequence[int]) -> str:
            out: list[str] = []
            run: list[bytes] = []
            for token_id in ids:
                if token_id in dropped:
                    continue
                if token_id < special:  # a kept control token ends a UTF-8 run
                    if run:
                        out.append(b"".join(run).decode("utf-8", "replace"))
                        run = []
                    out.append(self.special_texts[token_id])
                else:
                    run.append(token_bytes[token_id])
            if run:
                out.append(b"".join(run).decode("utf-8", "replace"))
            return "".join(out)

        return as_utf8

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]:
        """Prompt ids of a chat, as vLLM's Mistral renderer makes them.

        Raises `MistralTokenizerError` with vLLM's message when the request is refused.
        """
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        if add_generation_prompt and continue_final_message:
            raise MistralTokenizerError(
                "Cannot set both `add_generation_prompt` and `continue_final_message` to True."
            )
        if messages and add_generation_prompt and messages[-1].get("role") == "assistant":
            raise MistralTokenizerError(
                "Cannot set `add_generation_prompt` to True when the last message is from "
                "the assistant. Consider using `continue_final_message` instead."
            )
        if messages and continue_final_message and messages[-1].get("role") != "assistant":
            raise MistralTokenizerError(
                "Cannot set `continue_final_message` to True when the last message is not "
                "from the assistant."
            )
        try:
            request = ChatCompletionRequest.from_openai(
                messages=_truncated_tool_call_ids(messages),
                tools=tools,
                continue_final_message=continue_final_message,
            )
            tokens: list[int] = self._mistral.encode_chat_completion(request).tokens
        # mistral-common stops on bad input with assertions, its own exceptions and pydantic
        # errors alike; vLLM turns every one into a 400 with its text.
        except (
            AssertionError,
            MistralCommonException,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            IndexError,
        ) as exc:
            raise MistralTokenizerError(str(exc)) from exc
        return tokens


def _truncated_tool_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM keeps the last 9 characters of longer tool-call ids (Mistral's id length)."""
    out = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            message = copy.copy(message)
            calls = []
            for call in message["tool_calls"]:
                call_id = call.get("id") if isinstance(call, dict) else None
                if isinstance(call_id, str) and len(call_id) > _TOOL_CALL_ID_LENGTH:
                    call = {**call, "id": call_id[-_TOOL_CALL_ID_LENGTH:]}
                calls.append(call)
            message["tool_calls"] = calls
        elif role in ("tool", "tool_results"):
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and len(call_id) > _TOOL_CALL_ID_LENGTH:
                message = {**message, "tool_call_id": call_id[-_TOOL_CALL_ID_LENGTH:]}
        out.append(message)
    return out
