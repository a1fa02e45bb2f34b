"""The per-choice derender machine, shared by chat and completions, batch and streaming.

A choice starts from its prompt ids (``ChoiceMachine.start``) and is fed chunks of generated ids
(``ChoiceMachine.step``): the final stop token is dropped as vLLM drops it, the ids are
detokenized incrementally and the text goes through the request's parser, whose events the
endpoints turn into a message or a delta. A stream carries the ``ChoiceState`` between calls:
its constant part (``StreamFixed``: the request, the options, the parse context) is signed once,
the rest each chunk (``streams.py``); batch derender is the same machine fed the whole output as
one finished chunk, decoded id by id so that stop strings can cut it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from parsers import ChatParser, ChatState, Detokenizer, DetokState, Event, ParseRequest
from render_service.derender import logprobs as lp
from render_service.derender.parser_cache import running_digest, seed_digest
from render_service.derender.stop_strings import StopStrings, ids_for_text, stop_string_cut
from render_service.errors import InvalidRequest
from render_service.model.loading import Model
from render_service.model.parser_setup import ParserKey, ParsingSetup, parser_key
from render_service.protocol.derender import GenerateChoice, GenerateResponse
from render_service.protocol.logprobs import ChatCompletionLogProbs, CompletionLogProbs
from render_service.settings import DEFAULTS

_ENCODER = msgspec.msgpack.Encoder()


class OutputOptions(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What a chat or completion request changes in derendering, kept in the stream state."""

    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    #: Logprob candidates kept per position (None: all that generate sent).
    logprob_limit: int | None = None
    return_token_ids: bool = False
    include_reasoning: bool = True
    parallel_tool_calls: bool = True
    forced_tools: bool = False
    named_tool: bool = False


class StreamFixed(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What stays the same for a whole stream: signed once, at its first call.

    New fields go last with defaults (the codec's version covers incompatible changes).
    """

    request_id: str
    index: int
    prompt_len: int
    options: OutputOptions
    parse_request: ParseRequest | None


class StreamMoving(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What each chunk changes: parser and detokenizer state, never the history.

    New fields go last with defaults (the codec's version covers incompatible changes).
    """

    parser: ChatState | None
    detok: DetokState
    #: The running digest of the output so far (the key of the stream's cache entries).
    digest: bytes
    n_tokens: int = 0
    role_sent: bool = False
    logprob_context: tuple[int, ...] = ()
    text_offset: int = 0
    #: Digest of the raw prompt ids and chat request the stream started from (inputs.py).
    inputs: bytes = b""


@dataclass(frozen=True, slots=True)
class Sealed:
    """A stream's constant part as signed (``streams.py``): the token, its tag (each moving
    part is bound to it), the endpoint kind it was signed for and its parser's cache key."""

    kind: str
    token: str
    tag: bytes
    parser_key: ParserKey | None


class ChoiceState(StreamMoving, frozen=True, gc=False, kw_only=True):
    """One choice's stream between calls: its constant part and what each chunk changes.

    Never encoded whole: ``streams.py`` signs ``fixed`` once and the moving fields each chunk.
    """

    fixed: StreamFixed
    #: ``fixed`` as signed, once it has been (it then travels unchanged with every state).
    sealed: Sealed | None = None

    @property
    def request_id(self) -> str:
        return self.fixed.request_id

    @property
    def index(self) -> int:
        return self.fixed.index

    @property
    def prompt_len(self) -> int:
        return self.fixed.prompt_len

    @property
    def options(self) -> OutputOptions:
        return self.fixed.options

    @property
    def parse_request(self) -> ParseRequest | None:
        return self.fixed.parse_request

    @property
    def parser_key(self) -> ParserKey | None:
        return self.sealed.parser_key if self.sealed is not None else None

    def moving(self) -> StreamMoving:
        """The part signed each chunk (a ``StreamMoving``, not this subclass)."""
        return StreamMoving(*msgspec.structs.astuple(self)[:_MOVING_FIELDS])

    @classmethod
    def join(cls, sealed: Sealed, fixed: StreamFixed, moving: StreamMoving) -> ChoiceState:
        """The state of a verified constant part and a moving part bound to it."""
        return cls(*msgspec.structs.astuple(moving), fixed=fixed, sealed=sealed)


_MOVING_FIELDS = len(StreamMoving.__struct_fields__)


class StreamStart(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A stream before its first output id and before it is bound to a generate request: what
    ``ChoiceMachine.begin`` makes from the prompt and the request (a derender seed carries it).

    New fields go last with defaults.
    """

    prompt_len: int
    options: OutputOptions
    parse_request: ParseRequest | None
    parser: ChatState | None
    detok: DetokState
    #: Digest of the prompt ids, and of the parser's prompt where it differs (it keys the
    #: stream's cache entries with the rest).
    prompt: bytes


class ChunkResult(msgspec.Struct, frozen=True):
    """What one chunk of one choice produced (a Struct: made per chunk, and a frozen dataclass
    took longer to build)."""

    text: str
    events: list[Event]
    kept_ids: list[int]
    state: ChoiceState
    stop_reason: int | str | None
    #: A stop string ended the text (batch only): the finish reason is "stop".
    stopped: bool = False
    #: Batch only: the parser's state at the end of the output (the batch rule reads it).
    parser_end: ChatState | None = None


class ChoiceMachine:
    """One model's per-choice machine: its detokenizers, stop tokens and parser setup."""

    def __init__(
        self,
        model: Model,
        parsing: ParsingSetup | None,
        max_logprobs: int,
        max_n: int = DEFAULTS["max_n_sequences"],
        cache_bytes: int = DEFAULTS["small_cache_bytes"],
    ) -> None:
        self.model = model
        self.parsing = parsing
        self.max_logprobs = max_logprobs
        self.max_n = max_n
        self._eos_id = model.info.eos_token_id
        self._model_eos = frozenset(model.info.eos_token_ids)

        def decode(ids: Sequence[int]) -> str:
            return model.decode(list(ids), skip_special_tokens=False)

        self.texts = lp.TokenTexts(decode, model.known, cache_bytes=cache_bytes)
        special_ids = model.stream_special_ids()
        self._detok = {
            skip: Detokenizer(
                model.stream_decoder(skip), special_ids, skip, vocab_size=model.vocab_size
            )
            for skip in (True, False)
        }
        flags = (None, None) if parsing is None else (parsing.reasoning_parser, parsing.tool_parser)
        self._seed = seed_digest(model.identity, repr(flags).encode())

    @property
    def has_parser(self) -> bool:
        return self.parsing is not None

    def parser(
        self, parse_request: ParseRequest | None, key: ParserKey | None = None
    ) -> ChatParser | None:
        """The parser for a request (None without parser flags or without a chat request);
        ``key``: the request's ``parser_key``, where a stream already has it."""
        if self.parsing is None or parse_request is None:
            return None
        return self.parsing.parser(parse_request, key)

    def parser_key(self, parse_request: ParseRequest | None) -> ParserKey | None:
        """The parser cache's key for a stream's parse request (computed once per stream)."""
        if self.parsing is None or parse_request is None:
            return None
        return parser_key(parse_request)

    def start(
        self,
        request_id: str,
        index: int,
        prompt_ids: Sequence[int],
        options: OutputOptions,
        parse_request: ParseRequest | None,
        *,
        parser_prompt: Sequence[int] | None = None,
        stream: bool = True,
        kind: str = "chat",
    ) -> ChoiceState:
        """A choice before its first output id.

        ``parser_prompt``: the prompt the parser sees, where it differs from the detokenizer's.
        ``stream``: the state will be carried on (it then keeps a lean parse request and the
        digest that keys the parser cache); a batch choice needs neither. ``kind``: the
        endpoint the stream belongs to (``streams.STREAM_KINDS``).
        """
        if stream:
            start = self.begin(prompt_ids, options, parse_request, parser_prompt)
            return self.enter(start, request_id, index, kind)
        parser = self.parser(parse_request)
        parser_ids = prompt_ids if parser_prompt is None else parser_prompt
        return ChoiceState(
            fixed=StreamFixed(request_id, index, len(prompt_ids), options, None),
            parser=parser.start(parser_ids) if parser is not None else None,
            detok=self._detok[options.skip_special_tokens].start(prompt_ids),
            digest=b"",
        )

    def begin(
        self,
        prompt_ids: Sequence[int],
        options: OutputOptions,
        parse_request: ParseRequest | None,
        parser_prompt: Sequence[int] | None = None,
    ) -> StreamStart:
        """A stream's start from its prompt and request, before it has an id (a derender seed).

        ``parser_prompt``: the prompt the parser sees, where it differs (the digest covers it).
        """
        parser = self.parser(parse_request)
        parser_ids = prompt_ids if parser_prompt is None else parser_prompt
        prompt = _digest_ids(prompt_ids)
        if parser_prompt is not None and list(parser_prompt) != list(prompt_ids):
            prompt += _digest_ids(parser_prompt)
        return StreamStart(
            prompt_len=len(prompt_ids),
            options=options,
            parse_request=_lean(
                parse_request,
                parser is not None and parser.chat is not None and not parser.chat.tool_schemas,
            ),
            parser=parser.start(parser_ids) if parser is not None else None,
            detok=self._detok[options.skip_special_tokens].start(prompt_ids),
            prompt=prompt,
        )

    def enter(
        self, start: StreamStart, request_id: str, index: int, kind: str = "chat"
    ) -> ChoiceState:
        """The state of choice ``index`` of generate request ``request_id`` from ``start``, in a
        stream of endpoint ``kind``."""
        return ChoiceState(
            fixed=StreamFixed(
                request_id, index, start.prompt_len, start.options, start.parse_request
            ),
            parser=start.parser,
            detok=start.detok,
            digest=self._stream_seed(kind, request_id, index, start),
        )

    def step(
        self,
        state: ChoiceState,
        choice: GenerateChoice,
        parser: ChatParser | None,
        *,
        finished: bool,
        stops: StopStrings | None = None,
    ) -> ChunkResult:
        """Feed one chunk of one choice: its text, the parser's events and the next state.

        With ``stops`` (batch: the whole output, finished), the text is decoded id by id and cut
        at the first stop string, and the state is not advanced (nothing carries it on).
        """
        ids = list(choice.token_ids or [])
        options = state.options
        kept, stop_reason = self._drop_stop_token(ids, choice, options)
        detok = self._detok[options.skip_special_tokens]
        stopped = False
        if stops is None:
            detok_state, text = detok.step(state.detok, kept)
            if finished:
                detok_state, tail = detok.finish(detok_state)
                text += tail
        else:
            pieces = []
            detok_state = state.detok
            for token in kept:
                detok_state, piece = detok.step(detok_state, [token])
                pieces.append(piece)
            detok_state, tail = detok.finish(detok_state)
            if pieces:
                pieces[-1] += tail
            text = "".join(pieces)
            cut = stop_string_cut(
                text,
                pieces,
                stops.strings,
                stop_reason,
                stops.min_tokens,
                options.include_stop_str_in_output,
            )
            if cut is not None:
                text_end, matched = cut
                kept, text = ids_for_text(kept, pieces, text_end), text[:text_end]
                stop_reason, stopped = matched, True
        events: list[Event] = []
        parser_state = state.parser
        # vLLM sends a choice that ends without any output unparsed (an empty delta).
        parsed = bool(ids) or state.n_tokens > 0
        if parser is not None and parser_state is not None and parsed:
            if ids or finished:
                parser_state, events = parser.feed(parser_state, kept, text)
            if finished:
                parser_state, more = parser.finish(parser_state)
                events.extend(more)
        if stops is not None:
            return ChunkResult(text, events, kept, state, stop_reason, stopped, parser_state)
        new_state = msgspec.structs.replace(
            state,
            parser=parser_state,
            detok=detok_state,
            digest=running_digest(state.digest, ids),
            n_tokens=state.n_tokens + len(ids),
        )
        return ChunkResult(text, events, kept, new_state, stop_reason)

    def chat_logprobs(
        self, choice: GenerateChoice, options: OutputOptions, context: tuple[int, ...]
    ) -> tuple[ChatCompletionLogProbs | None, tuple[int, ...]]:
        """A chat chunk's logprobs and the repair context after it."""
        if choice.logprobs is None:
            return None, context
        return lp.chat_logprobs(
            choice.logprobs.content,
            self.texts,
            top_limit=options.logprob_limit,
            context_ids=context,
            sampled_ids=choice.token_ids,
        )

    def completion_logprobs(
        self, choice: GenerateChoice, options: OutputOptions, context: tuple[int, ...], offset: int
    ) -> tuple[CompletionLogProbs | None, tuple[int, ...]]:
        """A completions chunk's logprobs (text offsets from ``offset``) and the repair context."""
        if choice.logprobs is None:
            return None, context
        return lp.completion_logprobs(
            choice.logprobs.content,
            self.texts,
            top_limit=options.logprob_limit,
            context_ids=context,
            text_offset=offset,
            sampled_ids=choice.token_ids,
        )

    def check_responses(
        self, responses: Sequence[GenerateResponse], prompt_ids: list[int] | None = None
    ) -> None:
        """vLLM's derender bounds, with its messages, before any decoding: at most
        --max-n-sequences responses and choices each, every choice within the model's context
        and --max-logprobs, prompt logprobs and ids within the context."""
        max_n = self.max_n
        limit = self.model.info.max_model_len
        if len(responses) > max_n:
            raise InvalidRequest(
                f"generate_responses count ({len(responses)}) exceeds server maximum ({max_n}). "
                "Set VLLM_MAX_N_SEQUENCES to increase this limit."
            )
        for response in responses:
            if len(response.choices) > max_n:
                raise InvalidRequest(
                    f"choices count ({len(response.choices)}) in response "
                    f"'{response.request_id}' exceeds server maximum ({max_n})."
                )
            for choice in response.choices:
                self.check_choice(choice)
            prompt_logprobs = response.prompt_logprobs
            if isinstance(prompt_logprobs, list) and len(prompt_logprobs) > limit:
                raise InvalidRequest(
                    f"prompt_logprobs length ({len(prompt_logprobs)}) in response "
                    f"'{response.request_id}' exceeds max_model_len ({limit})."
                )
        if prompt_ids is not None and len(prompt_ids) > limit:
            raise InvalidRequest(
                f"prompt_token_ids has {len(prompt_ids)} ids, more than max_model_len={limit}"
            )

    def check_choice(self, choice: GenerateChoice) -> None:
        """One choice (batch, or a stream's chunk) within the context and --max-logprobs."""
        limit = self.model.info.max_model_len
        if choice.token_ids and len(choice.token_ids) > limit:
            raise InvalidRequest(
                f"token_ids length ({len(choice.token_ids)}) in choice {choice.index} exceeds "
                f"max_model_len ({limit})."
            )
        if choice.logprobs is None or not choice.logprobs.content:
            return
        content = choice.logprobs.content
        if len(content) > limit:
            raise InvalidRequest(
                f"logprobs.content length ({len(content)}) in choice {choice.index} exceeds "
                f"max_model_len ({limit})."
            )
        if self.max_logprobs < 0:
            return
        for entry in content:
            if len(entry.top_logprobs) > self.max_logprobs:
                raise InvalidRequest(
                    f"top_logprobs count ({len(entry.top_logprobs)}) in choice {choice.index} "
                    f"exceeds max_logprobs ({self.max_logprobs})."
                )

    def check_chunk_length(self, state: ChoiceState, choice: GenerateChoice) -> None:
        """A stream's prompt and output so far, plus this chunk, must fit the model's context."""
        limit = self.model.info.max_model_len
        total = state.prompt_len + state.n_tokens + len(choice.token_ids or [])
        if total > limit:
            raise InvalidRequest(
                f"prompt ({state.prompt_len}) + output so far ({state.n_tokens}) + this chunk exceed "
                f"max_model_len={limit}."
            )

    def _stream_seed(self, kind: str, request_id: str, index: int, start: StreamStart) -> bytes:
        """Cache-key seed: everything the state depends on (model identity and parser flags,
        the endpoint kind, the request and choice, the options, the parse context and the
        prompt), so two streams share a cached state only when they would compute the same one."""
        return seed_digest(
            self._seed,
            kind.encode(),
            request_id.encode(),
            index.to_bytes(4, "little"),
            _ENCODER.encode(start.options),
            _ENCODER.encode(start.parse_request),
            start.prompt,
        )

    def _drop_stop_token(
        self, ids: list[int], choice: GenerateChoice, options: OutputOptions
    ) -> tuple[list[int], int | str | None]:
        """vLLM's _drop_stop_token: the final stop token is not text (unless asked to keep it)."""
        stop_reason = choice.stop_reason
        if choice.finish_reason != "stop" or not ids or options.include_stop_str_in_output:
            return ids, stop_reason
        last = ids[-1]
        if isinstance(stop_reason, int) and not isinstance(stop_reason, bool):
            return (ids[:-1], stop_reason) if last == stop_reason else (ids, stop_reason)
        if stop_reason is None and last == self._eos_id:
            return ids[:-1], None
        if stop_reason is None and (last in options.stop_token_ids or last in self._model_eos):
            return ids[:-1], last
        return ids, stop_reason


def _digest_ids(ids: Sequence[int]) -> bytes:
    """16 bytes of SHA-256 over the ids as uint32 (hardware SHA: the fastest hash in hashlib)."""
    try:
        return hashlib.sha256(array("I", ids).tobytes()).digest()[:16]
    except OverflowError as exc:
        raise InvalidRequest("prompt_token_ids must lie in [0, 2**32)", "prompt_token_ids") from exc


def _lean(parse_request: ParseRequest | None, names_only: bool = False) -> ParseRequest | None:
    """What the parser still needs after ``start``: tool names and schemas and the template's
    on/off switches (a family may bind by them: DeepSeek-V3.1's `thinking`), no prose. A chat
    family that does not type values by the schemas (Harmony) needs tool names only."""
    if parse_request is None:
        return None
    tools = parse_request.tools
    if tools and names_only:
        tools = [{"type": "function", "function": {"name": _tool_name(t)}} for t in tools]
    elif tools:
        tools = [_strip_descriptions(t) for t in tools]
    switches = {k: v for k, v in parse_request.chat_template_kwargs.items() if isinstance(v, bool)}
    return msgspec.structs.replace(parse_request, tools=tools, chat_template_kwargs=switches)


def _tool_name(tool: dict[str, Any]) -> Any:
    function = tool.get("function")
    return function.get("name") if isinstance(function, dict) else None


def _strip_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_strip_descriptions(v) for v in value]
    return value
