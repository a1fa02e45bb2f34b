"""Derender seeds: a stream's start, made by render, so that every derender call is lean.

A render asked for one (``X-Derender-Seed: true``) answers with a ``derender_seed``: the state a
stream's first derender call would build from ``prompt_token_ids`` and ``chat_request``
(``ChoiceMachine.begin``), signed with the replicas' shared secret, together with the flags it
was made under. The client passes it to each choice's first derender call instead of both
fields. A derender replica started with another model or other parser flags answers 400 naming
the difference, rather than parsing the stream by rules its render never applied.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any, Final

import msgspec

from render_service.derender.machine import ChoiceMachine, ChoiceState, StreamStart
from render_service.derender.stop_strings import STREAM_STOP_STRINGS
from render_service.derender.stream_state import StateCodec
from render_service.errors import InvalidRequest
from render_service.model.loading import Model
from render_service.protocol.derender import GenerateChunk
from render_service.settings import Settings

__all__ = ["SEED_CONTEXT", "SeedConfig", "Seeds"]

#: Keys seeds apart from stream states signed with the same secret.
SEED_CONTEXT: Final = b"render-service/derender_seed"
_PARAM: Final = "derender_seed"


class SeedConfig(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What a seed is only valid under: the model and every flag that changes derendering."""

    served_model_name: str
    #: Digest of the tokenizer, chat template and context length.
    model_digest: bytes
    reasoning_parser: str | None
    tool_call_parser: str | None
    default_chat_template_kwargs: bytes
    reasoning_effort_map: bytes


class _Seed(msgspec.Struct, frozen=True, array_like=True, gc=False):
    config: SeedConfig
    start: StreamStart
    #: The request had stop strings, which streaming derender refuses (on its first call).
    stops: bool = False


# Each field's name as the operator knows it (the flag), in the order mismatches are reported.
_FLAGS: Final = (
    ("served_model_name", "--served-model-name"),
    ("model_digest", "the model (tokenizer, chat template or --max-model-len)"),
    ("reasoning_parser", "--reasoning-parser"),
    ("tool_call_parser", "--tool-call-parser with --enable-auto-tool-choice"),
    ("default_chat_template_kwargs", "--default-chat-template-kwargs"),
    ("reasoning_effort_map", "--reasoning-effort-map"),
)


class Seeds:
    """Makes and reads the derender seeds of one server (thread-safe: nothing mutates)."""

    def __init__(self, machine: ChoiceMachine, settings: Settings, secret: bytes) -> None:
        self.machine = machine
        self.settings = settings
        self.codec = StateCodec(secret, SEED_CONTEXT, settings.max_stream_state_bytes)

    @cached_property
    def config(self) -> SeedConfig:
        """This server's seed configuration (the model digest is computed on first use)."""
        settings = self.settings
        model = self.machine.model
        parsing = self.machine.parsing
        return SeedConfig(
            served_model_name=model.info.served_model_name,
            model_digest=model_digest(model),
            reasoning_parser=parsing.reasoning_parser if parsing is not None else None,
            tool_call_parser=parsing.tool_parser if parsing is not None else None,
            default_chat_template_kwargs=_canonical(settings.default_chat_template_kwargs),
            reasoning_effort_map=_canonical(settings.reasoning_effort_map),
        )

    def make(self, start: StreamStart, stops: bool) -> str:
        """The signed seed for ``start`` (``stops``: the request has stop strings)."""
        return self.codec.encode(_Seed(self.config, start, stops))

    def start(self, token: str, chunk: GenerateChunk, kind: str = "chat") -> ChoiceState:
        """The first state of ``chunk``'s choice (in a stream of endpoint ``kind``) from a seed;
        400 naming any flag that differs."""
        seed = self.codec.decode(token, _Seed)
        self.check(seed.config)
        if seed.stops:
            raise InvalidRequest(STREAM_STOP_STRINGS)
        return self.machine.enter(seed.start, chunk.request_id, chunk.choices[0].index, kind)

    def check(self, theirs: SeedConfig) -> None:
        """InvalidRequest naming the first setting in which ``theirs`` differs from ours."""
        ours = self.config
        for field, flag in _FLAGS:
            mine, other = getattr(ours, field), getattr(theirs, field)
            if mine == other:
                continue
            if isinstance(mine, bytes):
                detail = f"this server differs in {flag}"
            else:
                detail = f"it was made with {flag} {_show(other)}, this server has {_show(mine)}"
            raise InvalidRequest(
                f"derender_seed comes from a render server with other settings: {detail}. "
                "Start render and derender replicas with the same model and parser flags.",
                _PARAM,
            )


def model_digest(model: Model) -> bytes:
    """16 bytes over the tokenizer, the chat template and the context length."""
    info = model.info
    h = hashlib.sha256()
    for part in (
        model.tokenizer_bytes(),
        (info.chat_template or "").encode(),
        str(info.max_model_len).encode(),
    ):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()[:16]


def _canonical(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _show(value: Any) -> str:
    return "none" if value is None else repr(value)
