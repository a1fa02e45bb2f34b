"""The derender path: generated token ids -> OpenAI chat and completion responses.

Batch and streaming share one machine per choice: detokenize a chunk, feed the parser, turn its
events into a delta. Batch derender is that machine fed the whole output as one chunk. A stream
carries the machine's state between calls as a small signed value (``stream_state``), never the
output history, so a chunk costs O(its own tokens).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

import msgspec

from parsers import ChatParser, Detokenizer, Event, ParseRequest
from render_service.derender import logprobs as lp
from render_service.derender.assembly import delta_parts, make_usage, message_parts, now
from render_service.derender.machine import (
    CachedState,
    ChoiceState,
    ChunkResult,
    OutputOptions,
)
from render_service.derender.parser_cache import ParserCache, running_digest, seed_digest
from render_service.derender.stop_strings import ids_for_text, stop_string_cut
from render_service.derender.stream_state import StateCodec, random_secret
from render_service.errors import InvalidRequest, SchemaError
from render_service.model.loading import Model
from render_service.model.parser_setup import ParsingSetup, resolve_tool_choice
from render_service.model.templating import template_kwargs
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    GenerateChoice,
    GenerateChunk,
    VllmStreamState,
)
from render_service.protocol.logprobs import ChatCompletionLogProbs, CompletionLogProbs
from render_service.settings import Settings
from render_service.validation import convert, stop_strings

STATE_VERSION = 1
MISSING_CHAT_REQUEST = (
    "chat_request is required when a tool or reasoning parser is configured because plain "
    "detokenization would leak raw parser markup into content."
)
MISSING_PROMPT_IDS = (
    "prompt_token_ids is required when a tool or reasoning parser is configured. Without it "
    "parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that "
    "pre-opens <think>) and would misclassify reasoning content as plain content."
)
STREAM_STOP_STRINGS = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. "
    "Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop "
    "strings back."
)


class Derenderer:
    """Derenders outputs of one model, with the server's parser flags, cache and state codec."""

    def __init__(
        self,
        model: Model,
        parsing: ParsingSetup | None,
        settings: Settings,
        codec: StateCodec,
        cache: ParserCache[CachedState],
    ) -> None:
        self.model = model
        self.parsing = parsing
        self.settings = settings
        self.codec = codec
        self.cache = cache
        hf = self.model.hf_tokenizer
        self._special_ids = frozenset(hf.all_special_ids)
        self._eos_id = self.model.info.eos_token_id
        self._model_eos = frozenset(self.model.info.eos_token_ids)
        self._vocab = self.model.vocab_size
        backend = self.model.backend
        self._decode = lambda ids: backend.decode(list(ids), skip_special_tokens=False)
        self._texts = lp.TokenTexts(
            self._decode, lambda token: backend.id_to_token(token) is not None
        )
        self._detok = {
            skip: Detokenizer(self._decode, self._special_ids, skip, vocab_size=self._vocab)
            for skip in (True, False)
        }
        self._seed = seed_digest(
            self.model.info.served_model_name.encode(), repr(self._parser_flags()).encode()
        )

    def _parser_flags(self) -> tuple[str | None, str | None]:
        if self.parsing is None:
            return (None, None)
        return (self.parsing.reasoning_parser, self.parsing.tool_parser)

    @property
    def has_parser(self) -> bool:
        return self.parsing is not None

    @property
    def model_name(self) -> str:
        return self.model.info.served_model_name

    # ---- request context -----------------------------------------------------------------

    def _chat_request(self, raw: dict[str, Any] | None) -> ChatCompletionRequest | None:
        if raw is None:
            return None
        request = convert(raw, ChatCompletionRequest, "body.chat_request")
        return request

    def _chat_options(self, request: ChatCompletionRequest | None) -> OutputOptions:
        if request is None:
            return OutputOptions(skip_special_tokens=not self.has_parser)
        choice = resolve_tool_choice(request)
        skip = request.skip_special_tokens if request.skip_special_tokens is not None else True
        return OutputOptions(
            skip_special_tokens=False if self.has_parser else skip,
            include_stop_str_in_output=request.include_stop_str_in_output,
            stop_token_ids=tuple(request.stop_token_ids or ()),
            logprob_limit=lp.chat_top_limit(
                request.logprobs, request.top_logprobs, request.logprob_token_ids
            ),
            return_token_ids=bool(request.return_token_ids),
            include_reasoning=request.include_reasoning,
            parallel_tool_calls=request.parallel_tool_calls is not False,
            forced_tools=choice == "required" or isinstance(choice, dict),
            named_tool=isinstance(choice, dict),
        )

    def _parse_request(self, request: ChatCompletionRequest) -> ParseRequest | None:
        if self.parsing is None:
            return None
        tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
        choice = resolve_tool_choice(request)
        return self.parsing.parse_request(
            {
                "tools": tools,
                "tool_choice": choice,
                "parallel_tool_calls": request.parallel_tool_calls,
                "include_reasoning": request.include_reasoning,
                "chat_template_kwargs": template_kwargs(request, self.settings),
                "history_tool_call_cnt": 0,
            }
        )

    def _parser(self, parse_request: ParseRequest | None) -> ChatParser | None:
        if self.parsing is None or parse_request is None:
            return None
        return self.parsing.parser(parse_request)

    # ---- the per-choice machine -----------------------------------------------------------

    def _new_state(
        self,
        request_id: str,
        index: int,
        prompt_ids: Sequence[int],
        options: OutputOptions,
        parse_request: ParseRequest | None,
    ) -> ChoiceState:
        parser = self._parser(parse_request)
        detok = self._detok[options.skip_special_tokens]
        return ChoiceState(
            request_id=request_id,
            index=index,
            prompt_len=len(prompt_ids),
            options=options,
            parse_request=_lean(parse_request),
            parser=parser.start(prompt_ids) if parser is not None else None,
            detok=detok.start(prompt_ids),
            digest=self._stream_seed(request_id, index, options, parse_request),
        )

    def _stream_seed(
        self,
        request_id: str,
        index: int,
        options: OutputOptions,
        parse_request: ParseRequest | None,
    ) -> bytes:
        """Cache-key seed: model and parser flags, the parse context, the request and the choice."""
        return seed_digest(
            self._seed,
            request_id.encode(),
            index.to_bytes(4, "little"),
            msgspec.msgpack.encode(options),
            msgspec.msgpack.encode(parse_request),
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

    def _step(
        self, state: ChoiceState, choice: GenerateChoice, finished: bool, parser: ChatParser | None
    ) -> ChunkResult:
        ids = list(choice.token_ids or [])
        kept, stop_reason = self._drop_stop_token(ids, choice, state.options)
        detok = self._detok[state.options.skip_special_tokens]
        detok_state, text = detok.step(state.detok, kept)
        if finished:
            detok_state, tail = detok.finish(detok_state)
            text += tail
        events: list[Event] = []
        parser_state = state.parser
        if parser is not None and parser_state is not None:
            if ids or finished:
                parser_state, events = parser.feed(parser_state, kept, text)
            if finished:
                parser_state, more = parser.finish(parser_state)
                events.extend(more)
        new_state = msgspec.structs.replace(
            state,
            parser=parser_state,
            detok=detok_state,
            digest=running_digest(state.digest, ids),
            n_tokens=state.n_tokens + len(ids),
        )
        return ChunkResult(text, events, kept, new_state, stop_reason)

    # ---- chat, batch ----------------------------------------------------------------------

    def derender_chat(self, body: DerenderChatRequest) -> dict[str, Any]:
        """Non-streaming chat derender: vLLM's ChatCompletionResponse."""
        self.model.check_name(body.model)
        response = body.generate_response
        self._check_bounds(response.choices, body.prompt_token_ids)
        request = self._chat_request(body.chat_request)
        if self.has_parser and request is None:
            raise InvalidRequest(MISSING_CHAT_REQUEST)
        options = self._chat_options(request)
        parse_request = self._parse_request(request) if request is not None else None
        prompt_ids = body.prompt_token_ids or response.prompt_token_ids or []
        # vLLM gives the parser only the generate response's prompt ids (a known asymmetry).
        parser_prompt = response.prompt_token_ids or []
        stops = stop_strings(request.stop) if request is not None else []
        min_tokens = request.min_tokens if request is not None else 0
        choices = []
        completion_tokens = 0
        for choice in response.choices:
            if not choice.token_ids:
                raise InvalidRequest(f"choice {choice.index} has empty or null token_ids")
            completion_tokens += len(choice.token_ids)
            choices.append(
                self._batch_chat_choice(
                    response.request_id,
                    choice,
                    prompt_ids,
                    parser_prompt,
                    options,
                    parse_request,
                    stops,
                    min_tokens,
                )
            )
        return {
            "id": response.request_id,
            "object": "chat.completion",
            "created": now(),
            "model": body.model or self.model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": make_usage(body.prompt_tokens or 0, completion_tokens),
            "prompt_logprobs": response.prompt_logprobs,
            "prompt_token_ids": (
                response.prompt_token_ids
                if request is not None and request.return_token_ids
                else None
            ),
            "prompt_text": None,
            "kv_transfer_params": response.kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": response.metrics,
        }

    def _batch_chat_choice(
        self,
        request_id: str,
        choice: GenerateChoice,
        prompt_ids: Sequence[int],
        parser_prompt: Sequence[int],
        options: OutputOptions,
        parse_request: ParseRequest | None,
        stops: list[str],
        min_tokens: int,
    ) -> dict[str, Any]:
        ids = list(choice.token_ids or [])
        kept, stop_reason = self._drop_stop_token(ids, choice, options)
        finish_reason = choice.finish_reason or "stop"
        pieces = self._decode_pieces(prompt_ids, kept, options.skip_special_tokens)
        text = "".join(pieces)
        cut = stop_string_cut(
            text, pieces, stops, stop_reason, min_tokens, options.include_stop_str_in_output
        )
        if cut is not None:
            text_end, matched = cut
            kept, text = ids_for_text(kept, pieces, text_end), text[:text_end]
            stop_reason, finish_reason = matched, "stop"
        parser = self._parser(parse_request)
        reasoning: str | None = None
        content: str | None = text
        calls: list[dict[str, Any]] = []
        if parser is not None:
            state = parser.start(parser_prompt)
            state, events = parser.feed(state, kept, text)
            state, more = parser.finish(state)
            reasoning, content, calls = message_parts(
                events + more, request_id, choice.index, options
            )
            if content is None and not calls and parser.reasoning is None:
                content = ""  # vLLM: without a reasoning parser the whole (empty) text is content
            if calls and finish_reason == "stop" and not options.named_tool:
                finish_reason = "tool_calls"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if calls:
            message["tool_calls"] = calls
        message["reasoning"] = reasoning
        hide = parser is not None and not options.include_reasoning
        return {
            "index": choice.index,
            "message": message,
            "logprobs": None if hide else self._chat_logprobs(choice, options, ())[0],
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": choice.token_ids if options.return_token_ids and not hide else None,
            "routed_experts": None,
            "weight_versions": None,
        }

    def _decode_pieces(self, prompt_ids: Sequence[int], ids: list[int], skip: bool) -> list[str]:
        """Text of each id as the incremental decode emits it (held-back text lands on a later id)."""
        detok = self._detok[skip]
        state = detok.start(prompt_ids)
        pieces = []
        for token in ids:
            state, piece = detok.step(state, [token])
            pieces.append(piece)
        _, tail = detok.finish(state)
        if pieces:
            pieces[-1] += tail
        return pieces

    def _chat_logprobs(
        self, choice: GenerateChoice, options: OutputOptions, context: tuple[int, ...]
    ) -> tuple[ChatCompletionLogProbs | None, tuple[int, ...]]:
        if choice.logprobs is None:
            return None, context
        return lp.chat_logprobs(
            choice.logprobs.content,
            self._texts,
            top_limit=options.logprob_limit,
            context_ids=context,
            sampled_ids=choice.token_ids,
        )

    def _check_bounds(self, choices: list[GenerateChoice], prompt_ids: list[int] | None) -> None:
        limit = self.model.info.max_model_len
        if prompt_ids is not None and len(prompt_ids) > limit:
            raise InvalidRequest(
                f"prompt_token_ids has {len(prompt_ids)} ids, more than max_model_len={limit}"
            )
        for choice in choices:
            if choice.token_ids is not None and len(choice.token_ids) > limit:
                raise InvalidRequest(
                    f"choice {choice.index} has {len(choice.token_ids)} token_ids, more than max_model_len={limit}"
                )

    # ---- chat, streaming ------------------------------------------------------------------

    def derender_chat_stream(self, body: DerenderChatStreamRequest) -> dict[str, Any]:
        """Streaming chunks of one choice: ``{"chunk": ..., "stream_state": ...}``.

        With ``generate_chunks`` (several generate chunks of one choice, in order) the answer is
        ``{"chunks": [...], "stream_state": ...}``: one derendered chunk each, one state at the end.
        """
        self.model.check_name(body.model)
        chunks = _stream_chunks(body.generate_chunk, body.generate_chunks)
        request = self._chat_request(body.chat_request)
        if request is not None and stop_strings(request.stop):
            raise InvalidRequest(STREAM_STOP_STRINGS)
        token = body.stream_state
        state: ChoiceState | None = None
        outs = []
        finished = False
        for chunk in chunks:
            if len(chunk.choices) > 1:
                raise InvalidRequest(
                    "derender_chat_stream expects at most one choice per chunk "
                    f"(got {len(chunk.choices)})."
                )
            if not chunk.choices:
                outs.append(self._chat_chunk(body, chunk, [], request))
                continue
            if state is None:
                state = self._load_state(token, chunk, request, body.prompt_token_ids)
            else:
                _check_same_stream(state, chunk)
            choice, state = self._chat_stream_step(chunk, state)
            finished = chunk.choices[0].finish_reason is not None
            outs.append(self._chat_chunk(body, chunk, [choice], request))
        if state is not None:
            token = self._store(state, finished)
        if body.generate_chunks is not None:
            return {"chunks": outs, "stream_state": token}
        return {"chunk": outs[0], "stream_state": token}

    def _chat_stream_step(
        self, chunk: GenerateChunk, state: ChoiceState
    ) -> tuple[dict[str, Any], ChoiceState]:
        """One generate chunk of one choice -> the OpenAI stream choice and the next state."""
        choice = chunk.choices[0]
        self._check_stream_length(state, choice)
        parser = self._parser(state.parse_request)
        finished = choice.finish_reason is not None
        result = self._step(state, choice, finished, parser)
        options = state.options
        reasoning, content, calls = delta_parts(
            result.events, chunk.request_id, choice.index, options
        )
        if parser is None:
            content = result.text or None
        finish_reason = choice.finish_reason
        parser_state = result.state.parser
        if (
            finished
            and parser_state is not None
            and parser_state.tools_emitted
            and finish_reason == "stop"
            and not options.named_tool
        ):
            finish_reason = "tool_calls"
        hide = parser is not None and not options.include_reasoning
        logprobs, context = self._chat_logprobs(choice, options, state.logprob_context)
        delta: dict[str, Any] = {
            "role": None if state.role_sent else "assistant",
            "content": content,
            "reasoning": reasoning,
        }
        if calls:
            delta["tool_calls"] = calls
        out_choice = {
            "index": choice.index,
            "delta": delta,
            "logprobs": None if hide else logprobs,
            "finish_reason": finish_reason,
            "stop_reason": result.stop_reason,
            "token_ids": choice.token_ids if options.return_token_ids and not hide else None,
            "weight_versions": choice.weight_versions,
        }
        return out_choice, msgspec.structs.replace(
            result.state, role_sent=True, logprob_context=context
        )

    def _chat_chunk(
        self,
        body: DerenderChatStreamRequest,
        chunk: GenerateChunk,
        choices: list[dict[str, Any]],
        request: ChatCompletionRequest | None = None,
    ) -> dict[str, Any]:
        usage = None
        if chunk.usage is not None:
            prompt_tokens = (
                body.prompt_tokens
                if body.prompt_tokens is not None
                else chunk.usage.get("prompt_tokens", 0)
            )
            usage = make_usage(prompt_tokens or 0, chunk.usage.get("completion_tokens") or 0)
        return_ids = request is not None and request.return_token_ids
        return {
            "id": chunk.request_id,
            "object": "chat.completion.chunk",
            "created": now(),
            "model": body.model or self.model_name,
            "choices": choices,
            "usage": usage,
            "system_fingerprint": None,
            "prompt_token_ids": chunk.prompt_token_ids if return_ids else None,
            "prompt_text": None,
            "metrics": chunk.metrics,
            "kv_transfer_params": None,
        }

    def _check_stream_length(self, state: ChoiceState, choice: GenerateChoice) -> None:
        limit = self.model.info.max_model_len
        total = state.prompt_len + state.n_tokens + len(choice.token_ids or [])
        if total > limit:
            raise InvalidRequest(
                f"prompt ({state.prompt_len}) + output so far ({state.n_tokens}) + this chunk exceed "
                f"max_model_len={limit}."
            )

    # ---- state: signed token, cache, vLLM-format fallback ---------------------------------

    def _load_state(
        self,
        raw: Any,
        chunk: GenerateChunk,
        request: ChatCompletionRequest | None,
        prompt_ids: list[int] | None,
    ) -> ChoiceState:
        choice = chunk.choices[0]
        if raw is None or isinstance(raw, dict):
            if self.has_parser and request is None:
                raise InvalidRequest(MISSING_CHAT_REQUEST)
            if self.has_parser and prompt_ids is None:
                raise InvalidRequest(MISSING_PROMPT_IDS)
            ids = prompt_ids if prompt_ids is not None else (chunk.prompt_token_ids or [])
            options = self._chat_options(request)
            parse_request = self._parse_request(request) if request is not None else None
            fresh = self._new_state(chunk.request_id, choice.index, ids, options, parse_request)
            if raw is None:
                return fresh
            return self._resume_vllm_state(raw, fresh)
        state = self._decode_state(raw)
        _check_same_stream(state, chunk)
        return state

    def _decode_state(self, token: Any) -> ChoiceState:
        """A hit on the exact token we issued skips verifying and decoding it."""
        if isinstance(token, str):
            digest_hex, dot, signed = token.partition(".")
            if dot and len(digest_hex) == 32:
                digest = _digest_of(digest_hex)
                cached = self.cache.check_out(digest) if digest is not None else None
                if cached is not None and hmac.compare_digest(
                    cached[0].encode(), signed.encode(errors="replace")
                ):
                    return cached[1]
                token = signed
        return self.codec.decode(token, ChoiceState)

    def _store(self, state: ChoiceState, finished: bool) -> str:
        signed = self.codec.encode(state)
        if not finished:
            self.cache.check_in(state.digest, (signed, state))
        return f"{state.digest.hex()}.{signed}"

    def _resume_vllm_state(self, raw: dict[str, Any], fresh: ChoiceState) -> ChoiceState:
        """A client carrying vLLM's state (all output ids so far): resume from the longest cached
        prefix of that history, replaying only what is left (all of it on a miss)."""
        vllm_state = convert(raw, VllmStreamState, "body.stream_state")
        history = vllm_state.output_token_ids
        if sum(vllm_state.output_chunk_lens) != len(history):
            raise SchemaError(
                "1 validation error:\n  {'loc': 'body.stream_state', 'msg': 'Value error, "
                "output_chunk_lens must sum to len(output_token_ids)'}",
                "body.stream_state",
            )
        state = fresh
        done = 0
        found = self.cache.longest_prefix(fresh.digest, history)
        if found is not None:
            done, (_, state) = found
        if done < len(history):
            rest = GenerateChoice(
                index=fresh.index, finish_reason=None, token_ids=list(history[done:])
            )
            state = self._step(state, rest, False, self._parser(state.parse_request)).state
        return msgspec.structs.replace(
            state,
            role_sent=vllm_state.role_sent,
            logprob_context=tuple(vllm_state.logprob_context_token_ids),
            text_offset=vllm_state.logprob_text_offset,
        )

    # ---- completions ----------------------------------------------------------------------

    def derender_completion(self, body: DerenderCompletionRequest) -> dict[str, Any]:
        self.model.check_name(body.model)
        responses = body.generate_responses
        if not responses:
            raise InvalidRequest("generate_responses must not be empty")
        for name, values in (
            ("prompt_tokens", body.prompt_tokens),
            ("prompt_token_ids", body.prompt_token_ids),
        ):
            if values is not None and len(values) != len(responses):
                message = f"{name} length ({len(values)}) must equal generate_responses length ({len(responses)})"
                raise SchemaError(
                    f"1 validation error:\n  {{'loc': 'body', 'msg': 'Value error, {message}'}}",
                    "body",
                )
        request = (
            convert(body.completion_request, CompletionRequest, "body.completion_request")
            if body.completion_request is not None
            else None
        )
        options = _completion_options(request)
        stops = stop_strings(request.stop) if request is not None else []
        min_tokens = request.min_tokens if request is not None else 0
        choices = []
        completion_tokens = 0
        index = 0
        for position, response in enumerate(responses):
            self._check_bounds(response.choices, None)
            prompt_ids = (body.prompt_token_ids[position] if body.prompt_token_ids else None) or (
                response.prompt_token_ids or []
            )
            for choice in response.choices:
                if not choice.token_ids:
                    raise InvalidRequest(f"choice {choice.index} has empty or null token_ids")
                completion_tokens += len(choice.token_ids)
                kept, stop_reason = self._drop_stop_token(list(choice.token_ids), choice, options)
                finish_reason = choice.finish_reason or "stop"
                pieces = self._decode_pieces(prompt_ids, kept, options.skip_special_tokens)
                text = "".join(pieces)
                cut = stop_string_cut(
                    text, pieces, stops, stop_reason, min_tokens, options.include_stop_str_in_output
                )
                if cut is not None:
                    text = text[: cut[0]]
                    stop_reason, finish_reason = cut[1], "stop"
                logprobs = self._completion_logprobs(choice, options, (), 0)[0]
                choices.append(
                    {
                        "index": index,
                        "text": text,
                        "logprobs": logprobs,
                        "finish_reason": finish_reason,
                        "stop_reason": stop_reason,
                        "prompt_logprobs": response.prompt_logprobs,
                        "prompt_token_ids": prompt_ids if options.return_token_ids else None,
                        "token_ids": choice.token_ids if options.return_token_ids else None,
                        "routed_experts": None,
                        "weight_versions": None,
                    }
                )
                index += 1
        kv = responses[0].kv_transfer_params
        if any(r.kv_transfer_params != kv for r in responses[1:]):
            kv = None
        return {
            "id": responses[0].request_id,
            "object": "text_completion",
            "created": now(),
            "model": body.model or self.model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": make_usage(sum(body.prompt_tokens or []), completion_tokens),
            "kv_transfer_params": kv,
            "ec_transfer_params": None,
            "metrics": responses[0].metrics if len(responses) == 1 else None,
        }

    def _completion_logprobs(
        self, choice: GenerateChoice, options: OutputOptions, context: tuple[int, ...], offset: int
    ) -> tuple[CompletionLogProbs | None, tuple[int, ...]]:
        if choice.logprobs is None:
            return None, context
        return lp.completion_logprobs(
            choice.logprobs.content,
            self._texts,
            top_limit=options.logprob_limit,
            context_ids=context,
            text_offset=offset,
            sampled_ids=choice.token_ids,
        )

    def derender_completion_stream(self, body: DerenderCompletionStreamRequest) -> dict[str, Any]:
        self.model.check_name(body.model)
        chunk = body.generate_chunk
        request = (
            convert(body.completion_request, CompletionRequest, "body.completion_request")
            if body.completion_request is not None
            else None
        )
        if request is not None and stop_strings(request.stop):
            raise InvalidRequest(STREAM_STOP_STRINGS)
        if len(chunk.choices) > 1:
            raise InvalidRequest(
                f"derender_completion_stream expects at most one choice per chunk (got {len(chunk.choices)})."
            )
        choices_out = []
        token: Any = body.stream_state
        if chunk.choices:
            choice = chunk.choices[0]
            if body.stream_state is None or isinstance(body.stream_state, dict):
                ids = (
                    body.prompt_token_ids
                    if body.prompt_token_ids is not None
                    else (chunk.prompt_token_ids or [])
                )
                state = self._new_state(
                    chunk.request_id, choice.index, ids, _completion_options(request), None
                )
                if isinstance(body.stream_state, dict):
                    state = self._resume_vllm_state(body.stream_state, state)
            else:
                state = self._decode_state(body.stream_state)
                _check_same_stream(state, chunk)
            self._check_stream_length(state, choice)
            finished = choice.finish_reason is not None
            result = self._step(state, choice, finished, None)
            logprobs, context = self._completion_logprobs(
                choice, state.options, state.logprob_context, state.text_offset
            )
            offset = lp.advance_text_offset(state.text_offset, logprobs, result.text)
            options = state.options
            choices_out.append(
                {
                    "index": choice.index,
                    "text": result.text,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                    "stop_reason": result.stop_reason,
                    "prompt_token_ids": chunk.prompt_token_ids
                    if options.return_token_ids
                    else None,
                    "token_ids": choice.token_ids if options.return_token_ids else None,
                    "weight_versions": choice.weight_versions,
                }
            )
            new_state = msgspec.structs.replace(
                result.state, role_sent=True, logprob_context=context, text_offset=offset
            )
            token = self._store(new_state, finished)
        usage = None
        if chunk.usage is not None:
            prompt_tokens = (
                body.prompt_tokens
                if body.prompt_tokens is not None
                else chunk.usage.get("prompt_tokens", 0)
            )
            usage = make_usage(prompt_tokens or 0, chunk.usage.get("completion_tokens") or 0)
        out = {
            "id": chunk.request_id,
            "object": "text_completion",
            "created": now(),
            "model": body.model or self.model_name,
            "choices": choices_out,
            "usage": usage,
            "system_fingerprint": None,
            "metrics": chunk.metrics,
            "kv_transfer_params": None,
        }
        return {"chunk": out, "stream_state": token}


def _stream_chunks(
    one: GenerateChunk | None, several: list[GenerateChunk] | None
) -> list[GenerateChunk]:
    if (one is None) == (several is None) or several == []:
        raise SchemaError(
            "1 validation error:\n  {'loc': 'body.generate_chunk', 'msg': 'Give exactly one of "
            "generate_chunk and a non-empty generate_chunks'}",
            "body.generate_chunk",
        )
    return [one] if one is not None else list(several or [])


def _check_same_stream(state: ChoiceState, chunk: GenerateChunk) -> None:
    """A state continues only the stream (generate request and choice) it was made for."""
    choice = chunk.choices[0]
    if state.request_id != chunk.request_id or state.index != choice.index:
        raise InvalidRequest(
            "stream_state belongs to another stream (request id or choice index differ)",
            "stream_state",
        )


def _completion_options(request: CompletionRequest | None) -> OutputOptions:
    if request is None:
        return OutputOptions()
    return OutputOptions(
        skip_special_tokens=request.skip_special_tokens
        if request.skip_special_tokens is not None
        else True,
        include_stop_str_in_output=request.include_stop_str_in_output,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        logprob_limit=lp.completion_top_limit(request.logprobs, request.logprob_token_ids),
        return_token_ids=bool(request.return_token_ids),
    )


def _lean(parse_request: ParseRequest | None) -> ParseRequest | None:
    """What the parser still needs after ``start``: tool names and schemas, no prose or template kwargs."""
    if parse_request is None:
        return None
    tools = (
        [_strip_descriptions(t) for t in parse_request.tools]
        if parse_request.tools
        else parse_request.tools
    )
    return msgspec.structs.replace(parse_request, tools=tools, chat_template_kwargs={})


def _strip_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_strip_descriptions(v) for v in value]
    return value


def _digest_of(token_prefix: str) -> bytes | None:
    try:
        return bytes.fromhex(token_prefix)
    except ValueError:
        return None


def build_derenderer(model: Model, parsing: ParsingSetup | None, settings: Settings) -> Derenderer:
    """A Derenderer with the server's state secret (or a per-process random one) and a fresh cache."""
    secret = settings.state_secret.encode() if settings.state_secret else random_secret()
    context = msgspec.json.encode(
        [
            STATE_VERSION,
            model.info.served_model_name,
            settings.reasoning_parser,
            settings.tool_call_parser,
            settings.enable_auto_tool_choice,
        ]
    )
    codec = StateCodec(secret, context, max_bytes=settings.max_stream_state_bytes)
    cache: ParserCache[CachedState] = ParserCache(
        max_entries=settings.parser_cache_entries, ttl_seconds=settings.parser_cache_ttl
    )
    return Derenderer(model, parsing, settings, codec, cache)
