"""Our own chat-template Jinja2 environment, equal in output to transformers' (what vLLM 0.33 runs).

The template sees what ``apply_chat_template(tokenize=False)`` gives it: Jinja2's immutable
sandbox with ``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``{% generation %}`` tag that
renders its body, the filter ``tojson`` (``json.dumps`` with ``ensure_ascii=False``, no HTML
escaping, and the options ``indent``, ``separators``, ``sort_keys``), the globals
``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` that refuses underscore
names; its inputs rebuilt from plain JSON types, None-valued message keys dropped, the tokenizer's
special tokens as variables, reasoning aliased under ``reasoning_content`` and ``thinking``.

The sandbox stays: every attribute still passes the immutable sandbox's checks. What changes is
their cost. The sandbox's verdict on an attribute of a plain value (a str, list, dict, number,
loop or namespace) depends only on the value's type and the attribute's name, so it is decided
once per (type, name) and remembered; a key lookup on a plain dict skips the failed attribute
lookup the sandbox tries first, when the key cannot name a dict attribute. Calls of vetted
built-in methods of plain values go straight through. Everything else takes the sandbox's own
path unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from collections.abc import Callable, Mapping
from datetime import datetime
from itertools import compress
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.sandbox
import jinja2.utils

from render_service.caches import ByteLRU
from render_service.model.known_templates import KnownTemplate, usable
from render_service.settings import DEFAULTS

__all__ = ["ChatEnvironment", "compile_template", "render_chat"]

# Names a plain dict answers as attributes (methods, dunders): any other name is a key lookup.
_DICT_NAMES = frozenset(dir(dict))
# Types whose sandbox verdict on an attribute depends on nothing but the type and the name.
_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list, tuple})
_PLAIN_TYPES = _PLAIN_SCALARS | _CONTAINERS
_LEARNABLE_BUILTINS = frozenset({*_PLAIN_SCALARS, list, tuple, dict, jinja2.runtime.LoopContext})
# Receivers whose built-in methods need no context and are never marked unsafe.
_PLAIN_RECEIVERS = frozenset({str, int, float, bool, list, tuple, dict})
# str.format / format_map go through the sandbox's formatter, always.
_FORMAT_NAMES = frozenset({"format", "format_map"})
# Bounds the remembered verdicts (names come from template text, or format strings built at
# render time).
_MAX_VERDICTS = 4096
_BuiltinMethod = types.BuiltinMethodType


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (as a call block, so its
    scoping is transformers'); we never track the assistant spans it marks."""

    tags = {"generation"}  # noqa: RUF012  (Extension declares it a plain attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class ChatNamespace(jinja2.utils.Namespace):
    """Jinja's ``namespace``, refusing underscore-prefixed names (no route to internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
            f"{name!r}. Please rename the attribute."
        )


_LEARNABLE = _LEARNABLE_BUILTINS | {ChatNamespace}


class _DictFactory:
    """The template's ``dict``: builds dicts, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def raise_exception(message: Any) -> None:
    """The template's own error (it becomes the 400's message)."""
    raise jinja2.exceptions.TemplateError(message)


def tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps``, non-ASCII kept, nothing HTML-escaped."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format: str) -> str:
    """Today's date or time in the template's format."""
    return datetime.now().strftime(format)


# A template calling one of these wrongly gets Python's TypeError, which names the function by
# its qualified name: we give ours the names transformers' have, so the 400's text is vLLM's.
_TRANSFORMERS_SCOPE = "_cached_compile_jinja_template.<locals>."
for _function in (raise_exception, tojson, strftime_now):
    _function.__qualname__ = _TRANSFORMERS_SCOPE + _function.__name__
for _method in (_DictFactory.__call__, _DictFactory.fromkeys):
    _method.__qualname__ = f"{_TRANSFORMERS_SCOPE}TemplateDict.{_method.__name__}"


class ChatEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox with chat templates' filters and globals, and remembered verdicts."""

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = tojson
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now
        self.globals["dict"] = _DictFactory()
        self.globals["namespace"] = ChatNamespace
        self._safe: set[tuple[type, str]] = set()

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if (kind, attribute) in self._safe:
            try:
                return getattr(obj, attribute)
            except AttributeError:  # a namespace without it: the sandbox's own answer
                return super().getattr(obj, attribute)
        if kind in _LEARNABLE and attribute not in _FORMAT_NAMES:
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return super().getattr(obj, attribute)
            if self.is_safe_attribute(obj, attribute, value):
                if len(self._safe) < _MAX_VERDICTS:
                    self._safe.add((kind, attribute))
                return value
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if type(obj) is dict and type(argument) is str and argument not in _DICT_NAMES:
            try:
                return obj[argument]
            except KeyError:
                return self.undefined(obj=obj, name=argument)
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(__obj) is _BuiltinMethod and type(__obj.__self__) in _PLAIN_RECEIVERS:
            # Reached only through getattr above, which vetted the method; built-ins take no
            # context and carry no unsafe marks, so Context.call would just call it.
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            try:
                return __obj(*args, **kwargs)
            except StopIteration:
                return __self.undefined(
                    "value was undefined because a callable raised a StopIteration exception"
                )
        return super().call(__context, __obj, *args, **kwargs)


_ENVIRONMENT = ChatEnvironment()

#: Compiled templates, keyed by the template itself (a str caches its hash, so the model's own
#: template is found without hashing it again).
COMPILED: ByteLRU[str, jinja2.Template] = ByteLRU(
    "compiled_templates", DEFAULTS["small_cache_bytes"]
)
# A compiled template holds its code objects and module: several times the source's size.
_COMPILED_BYTES_PER_CHAR = 24


def compile_template(template: str) -> jinja2.Template:
    """The template compiled in the chat environment (once per distinct template)."""
    compiled = COMPILED.get(template)
    if compiled is None:
        compiled = _ENVIRONMENT.from_string(template)
        COMPILED.put(template, compiled, 16384 + (_COMPILED_BYTES_PER_CHAR + 4) * len(template))
    return compiled


def _is_plain(value: Any) -> bool:
    """Whether ``value`` is built of exact JSON types only (then it is passed as it is).

    A walk over containers whose per-item work runs in C (type sets, ``compress``): most
    containers hold scalars only and cost a few C calls each."""
    stack: list[Any] = [(value,)]
    while stack:
        items = stack.pop()
        if type(items) is dict:
            if not _PLAIN_SCALARS.issuperset(map(type, items)):
                return False
            items = items.values()
        kinds = set(map(type, items))
        if kinds <= _PLAIN_SCALARS:
            continue
        if not kinds <= _PLAIN_TYPES:
            return False
        stack.extend(compress(items, map(_CONTAINERS.__contains__, map(type, items))))
    return True


def _plain(value: Any) -> Any:
    """``value`` rebuilt of plain types: subclasses cut back to their base, mappings to dicts,
    dataclasses and models to dicts, anything else to a placeholder naming its type."""
    if _is_plain(value):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


# Names a message's reasoning goes by; templates read the first, gpt-oss's read "thinking".
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_REASONING_KEYS = frozenset(_REASONING_FIELDS)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# vLLM calls apply_chat_template(conversation=..., tools=..., chat_template=..., tokenize=False,
# return_dict=False, **kwargs): a kwarg of one of these names is a TypeError there; the other
# parameters of that method are consumed by it and never reach the template.
_BOUND_PARAMETERS = frozenset({"conversation", "tools", "chat_template", "tokenize", "return_dict"})
_CONSUMED_PARAMETERS = ("padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs")


def _message(message: dict[str, Any], plain: bool) -> dict[str, Any]:
    out = {k: v if plain else _plain(v) for k, v in message.items() if v is not None}
    if _REASONING_KEYS.isdisjoint(out):  # most messages: no generator to set up
        return out
    reasoning = next((out[k] for k in _REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def render_chat(
    template: str,
    conversation: list[dict[str, Any]],
    tools: list[Any] | None,
    special_tokens: Mapping[str, Any],
    kwargs: dict[str, Any],
    known: KnownTemplate | None = None,
) -> str:
    """The prompt text, as ``apply_chat_template(conversation, tools, chat_template=template,
    tokenize=False, **special_tokens, **kwargs)`` renders it (same errors and messages).

    ``known``: the template's plain-Python renderer (known_templates), used where it covers
    the conversation."""
    kwargs = dict(kwargs)
    for name in _BOUND_PARAMETERS & kwargs.keys():
        raise TypeError(
            "transformers.tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template() "
            f"got multiple values for keyword argument {name!r}"
        )
    if kwargs.pop("return_assistant_tokens_mask", False):
        raise ValueError(
            "`return_assistant_tokens_mask=True` requires `return_dict=True` and `tokenize=True`"
        )
    if kwargs.pop("sanitize_control_tokens", False):
        raise ValueError(
            "`sanitize_control_tokens=True` requires `tokenize=True` and is not compatible with "
            "`return_assistant_tokens_mask=True`."
        )
    for name in _CONSUMED_PARAMETERS:
        kwargs.pop(name, None)
    documents = kwargs.pop("documents", None)
    add_generation_prompt = kwargs.pop("add_generation_prompt", False)
    continue_final: Any = kwargs.pop("continue_final_message", False)
    if not conversation:
        raise ValueError(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    if continue_final and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a "
            "new assistant message instead."
        )
    compiled = compile_template(template)
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise ValueError(
            "Tools should either be a JSON schema, or a callable function with type hints and a "
            "docstring suitable for auto-conversion to a schema."
        )
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    variables = _plain({**special_tokens, **kwargs})
    plain = _is_plain(conversation)
    chat = [_message(m, plain) for m in conversation]
    if known is not None and not continue_final and usable(kwargs, special_tokens):
        text = known(chat, _plain(tools), add_generation_prompt, variables)
        if text is not None:
            return text
    final_text: Any = None
    if continue_final:
        final_text = _tag_final_message(chat, continue_final, template)
    rendered: str = compiled.render(
        messages=chat,
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    if continue_final:
        rendered = _cut_at_tag(rendered, final_text)
    return rendered


def _tag_final_message(chat: list[dict[str, Any]], field: Any, template: str) -> Any:
    """Append the continue tag to the final message's text (in a copy); its text before."""
    field = field if isinstance(field, str) else "content"
    final = chat[-1] = dict(chat[-1])
    text = final.get(field)
    if text is None:
        raise ValueError(
            f'continue_final_message is set but the final message has no "{field}" to continue!'
        )
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [f for f in _REASONING_FIELDS if final.get(f) == text]
    if not any(f in template for f in fields):
        raise ValueError(
            f'continue_final_message is set to "{field}" but this is not an accepted field in the '
            "chat_template"
        )
    if isinstance(text, (list, tuple)):
        blocks = [dict(b) if isinstance(b, dict) else b for b in text]
        final[field] = blocks if isinstance(text, list) else tuple(blocks)
        for block in reversed(blocks):
            if "text" in block:
                text = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                return text
        raise ValueError(
            "continue_final_message is set but we could not find any text to continue in the "
            "final message!"
        )
    for f in fields:
        final[f] = final[f] + _CONTINUE_TAG
    return text


def _cut_at_tag(rendered: str, final_text: Any) -> str:
    if final_text.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat "
            "after applying the chat template! This can happen if the chat template deletes "
            "portions of the final message. Please verify the chat template and final message in "
            "your chat to ensure they are compatible."
            f"Final message to continue: {final_text.strip()}\nRendered chat:\n{rendered}"
        )
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
