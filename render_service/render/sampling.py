"""``sampling_params`` as vLLM 0.33 serializes SamplingParams: its field order, defaults left out."""

from __future__ import annotations

from typing import Any

import msgspec

from render_service.errors import InvalidRequest, invalid_param
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.settings import DEFAULTS
from render_service.validation import stop_strings

_GREEDY_EPS = 1e-5
# The OpenAI defaults behind request value and the model's generation_config.
_OPENAI_DEFAULTS = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
_STRUCTURED_FIELDS = (
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
    "structural_tag",
)
_STRUCTURED_DEFAULTS: dict[str, Any] = {
    "disable_any_whitespace": False,
    "disable_additional_properties": False,
}


def resolve_sampling_value(name: str, requested: Any, defaults: dict[str, Any]) -> Any:
    if requested is not None:
        return requested
    return defaults.get(name, _OPENAI_DEFAULTS[name])


def sampled_values(request: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """The request's penalties, temperature and nucleus values over the model's ``defaults``."""
    return {
        name: resolve_sampling_value(name, getattr(request, name), defaults)
        for name in _OPENAI_DEFAULTS
    }


def structured_outputs(
    structured: dict[str, Any] | None, response_format: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Merge ``structured_outputs`` and ``response_format`` into vLLM's StructuredOutputsParams."""
    fields: dict[str, Any] = dict(structured or {})
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_schema":
            schema = response_format.get("json_schema")
            if schema is None:
                raise invalid_param(
                    "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                    "response_format",
                )
            fields["json"] = schema.get("schema", schema.get("json_schema"))
        elif kind == "json_object":
            fields["json_object"] = True
        elif kind == "structural_tag":
            fields["structural_tag"] = response_format
    if sum(fields.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise InvalidRequest(
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice')."
        )
    if not any(
        fields.get(k) is not None for k in _STRUCTURED_FIELDS if k not in _STRUCTURED_DEFAULTS
    ):
        return None
    out = {k: fields.get(k, _STRUCTURED_DEFAULTS.get(k)) for k in _STRUCTURED_FIELDS}
    out["_backend"] = None
    out["_backend_was_auto"] = False
    return out


def verify_sampling(
    n: int, sampling: dict[str, Any], min_tokens: int, max_tokens: int, max_n: int
) -> None:
    """SamplingParams' own range checks, with vLLM's messages (built only for a failure)."""
    failure = _sampling_failure(n, sampling, min_tokens, max_tokens, max_n)
    if failure is not None:
        param, message, value = failure
        raise invalid_param(message, param, value)


def _sampling_failure(
    n: int, sampling: dict[str, Any], min_tokens: int, max_tokens: int, max_n: int
) -> tuple[str, str, Any] | None:
    """The first failed check as (param, message, value), in SamplingParams' order."""
    if n < 1:
        return "n", f"n must be at least 1, got {n}.", n
    if n > max_n:
        return (
            "n",
            f"n must be at most {max_n}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable.",
            n,
        )
    value = sampling["presence_penalty"]
    if not -2.0 <= value <= 2.0:
        return "presence_penalty", f"presence_penalty must be in [-2, 2], got {value}.", value
    value = sampling["frequency_penalty"]
    if not -2.0 <= value <= 2.0:
        return "frequency_penalty", f"frequency_penalty must be in [-2, 2], got {value}.", value
    value = sampling["repetition_penalty"]
    if not value > 0.0:
        return (
            "repetition_penalty",
            f"repetition_penalty must be greater than zero, got {value}.",
            value,
        )
    value = sampling["temperature"]
    if not value >= 0.0:
        return "temperature", f"temperature must be non-negative, got {value}.", value
    value = sampling["top_p"]
    if not 0.0 < value <= 1.0:
        return "top_p", f"top_p must be in (0, 1], got {value}.", value
    value = sampling["top_k"]
    if value is not None and value < -1:
        return "top_k", f"top_k must be 0 (disable), or at least 1, got {value}.", value
    value = sampling["min_p"]
    if not 0.0 <= value <= 1.0:
        return "min_p", f"min_p must be in [0, 1], got {value}.", value
    if min_tokens < 0:
        return (
            "min_tokens",
            f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
            min_tokens,
        )
    if min_tokens > max_tokens:
        return (
            "min_tokens",
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            min_tokens,
        )
    return None


def build_sampling_params(
    *,
    n: int,
    sampling: dict[str, Any],
    seed: int | None,
    stop: list[str],
    stop_token_ids: list[int],
    ignore_eos: bool,
    max_tokens: int,
    min_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    logprob_token_ids: list[int] | None,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    include_stop_str_in_output: bool,
    stream: bool,
    stream_interval: int | None,
    structured: dict[str, Any] | None,
    logit_bias: dict[str, float] | None,
    allowed_token_ids: list[int] | None,
    extra_args: dict[str, Any] | None,
    bad_words: list[str],
    thinking_token_budget: int | None,
    repetition_detection: dict[str, Any] | None,
    max_n: int = DEFAULTS["max_n_sequences"],
) -> dict[str, Any]:
    """The JSON object vLLM writes for these SamplingParams, keys in its field order."""
    verify_sampling(n, sampling, min_tokens, max_tokens, max_n)
    greedy = sampling["temperature"] < _GREEDY_EPS
    out: dict[str, Any] = {}
    if n != 1:
        out["n"] = n
    for key in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature"):
        out[key] = float(sampling[key])
    if not greedy:
        out["top_p"] = float(sampling["top_p"])
        if sampling["top_k"] not in (0, -1, None):
            out["top_k"] = int(sampling["top_k"])
        out["min_p"] = float(sampling["min_p"])
    if seed is not None:
        out["seed"] = seed
    out["stop"] = stop
    out["stop_token_ids"] = stop_token_ids
    if ignore_eos:
        out["ignore_eos"] = True
    if max_tokens != 16:
        out["max_tokens"] = max_tokens
    if min_tokens:
        out["min_tokens"] = min_tokens
    if logprobs is not None:
        out["logprobs"] = logprobs
    if prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs
    if logprob_token_ids is not None:
        out["logprob_token_ids"] = logprob_token_ids
    if not skip_special_tokens:
        out["skip_special_tokens"] = False
    if not spaces_between_special_tokens:
        out["spaces_between_special_tokens"] = False
    if include_stop_str_in_output:
        out["include_stop_str_in_output"] = True
    out["output_kind"] = 1 if stream else 2
    if stream_interval is not None:
        out["stream_interval"] = stream_interval
    out["skip_clone"] = True
    if stop and not include_stop_str_in_output:
        buffer = max(len(s) for s in stop) - 1
        if buffer > 0:
            out["output_text_buffer_length"] = buffer
    if structured is not None:
        out["structured_outputs"] = structured
    if logit_bias is not None:
        out["logit_bias"] = logit_bias
    if allowed_token_ids is not None:
        out["allowed_token_ids"] = allowed_token_ids
    if extra_args:
        out["extra_args"] = extra_args
    out["bad_words"] = bad_words
    out["skip_reading_prefix_cache"] = prompt_logprobs is not None
    if thinking_token_budget is not None:
        out["thinking_token_budget"] = thinking_token_budget
    if repetition_detection is not None:
        out["repetition_detection"] = repetition_detection
    return out


def request_sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    defaults: dict[str, Any],
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    skip_special_tokens: bool,
    structured: dict[str, Any] | None,
    max_n: int = DEFAULTS["max_n_sequences"],
) -> dict[str, Any]:
    """The sampling params of a chat or completion request over the model's ``defaults``."""
    sampling = sampled_values(request, defaults)
    extra = dict(request.vllm_xargs) if request.vllm_xargs else None
    return build_sampling_params(
        n=request.n if request.n is not None else 1,
        sampling=sampling,
        seed=request.seed,
        stop=stop_strings(request.stop),
        stop_token_ids=list(dict.fromkeys(request.stop_token_ids or [])),
        ignore_eos=request.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=request.logprob_token_ids,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        stream=bool(request.stream),
        stream_interval=request.stream_interval,
        structured=structured,
        logit_bias=request.logit_bias,
        allowed_token_ids=request.allowed_token_ids,
        extra_args=extra,
        bad_words=list(request.bad_words),
        thinking_token_budget=getattr(request, "thinking_token_budget", None),
        repetition_detection=request.repetition_detection,
        max_n=max_n,
    )


def stream_options(request: ChatCompletionRequest | CompletionRequest) -> dict[str, Any] | None:
    """The request's ``stream_options`` as the GenerateRequest carries them: only when streaming."""
    if request.stream and request.stream_options is not None:
        options: dict[str, Any] = msgspec.to_builtins(request.stream_options)
        return options
    return None
