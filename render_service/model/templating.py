"""Chat templates: turning OpenAI messages into the prompt text, exactly as vLLM 0.33 does.

Templates run in our own Jinja2 sandbox (render_service.model.chat_jinja), built to give what
transformers' ``apply_chat_template(tokenize=False)`` gives under vLLM: the same variables,
filters and output.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

import jinja2
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
import msgspec

from render_service.caches import ByteLRU
from render_service.errors import InvalidRequest
from render_service.model import chat_jinja
from render_service.model.known_templates import KnownTemplate
from render_service.model.sandbox import TemplateSandbox
from render_service.protocol.chat import IMAGE_PART_TYPES, ChatCompletionRequest
from render_service.protocol.tokenize import TokenizeChatRequest
from render_service.settings import DEFAULTS, Settings

ContentFormat = Literal["string", "openai"]

# vLLM always merges its Cohere-only ``--cohere-format`` default into chat_template_kwargs.
VLLM_DEFAULT_TEMPLATE_KWARGS = {"cohere_format": "cmd4"}

# Parameters of apply_chat_template that always reach the template, whatever it references.
_ALWAYS_PASSED = frozenset(
    {"add_generation_prompt", "continue_final_message", "documents", "tools"}
)


def _parse(template: str) -> jinja2.nodes.Template:
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        extensions=["jinja2.ext.loopcontrols"]
    ).parse(template.replace("{% generation %}", "").replace("{% endgeneration %}", ""))


def _iterates_content(node: jinja2.nodes.Node) -> bool:
    target = node.iter if isinstance(node, jinja2.nodes.For) else None
    if isinstance(target, jinja2.nodes.Getattr):
        return target.attr == "content"
    if isinstance(target, jinja2.nodes.Getitem):
        return isinstance(target.arg, jinja2.nodes.Const) and target.arg.value == "content"
    return False


class TemplateFacts(msgspec.Struct, frozen=True):
    """What the render path reads off a template's syntax tree, kept instead of the tree."""

    content_format: ContentFormat
    variables: frozenset[str]


#: Facts per template, keyed by the template's digest (so the cache never holds the template).
TEMPLATE_FACTS: ByteLRU[bytes, TemplateFacts] = ByteLRU("templates", DEFAULTS["small_cache_bytes"])


def template_facts(template: str) -> TemplateFacts:
    """The template's content format and variables (parsed once per distinct template)."""
    key = hashlib.blake2b(template.encode(), digest_size=16).digest()
    facts = TEMPLATE_FACTS.get(key)
    if facts is not None:
        return facts
    try:
        ast = _parse(template)
    except jinja2.TemplateSyntaxError:
        facts = TemplateFacts("string", frozenset())
    else:
        loops = any(_iterates_content(n) for n in ast.find_all(jinja2.nodes.For))
        facts = TemplateFacts(
            "openai" if loops else "string",
            frozenset(jinja2.meta.find_undeclared_variables(ast)),
        )
    TEMPLATE_FACTS.put(key, facts, 256 + sum(64 + len(v) for v in facts.variables))
    return facts


def detect_content_format(template: str) -> ContentFormat:
    """'openai' when the template loops over a message's content parts, else 'string'."""
    return template_facts(template).content_format


def template_variables(template: str) -> frozenset[str]:
    """Names the template reads from its context (kwargs it does not read are dropped)."""
    return template_facts(template).variables


def supports_developer_role(template: str) -> bool:
    """vLLM's test: the template names the role as a quoted string."""
    return '"developer"' in template or "'developer'" in template


def _content_text_parts(content: list[Any], path: str, images: bool = False) -> list[str | None]:
    """Texts of the parts, None for an image part (only when ``images``; else they refuse)."""
    texts: list[str | None] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise InvalidRequest(f"Invalid content part at {path}.{i}", f"{path}.{i}")
        kind = part.get("type")
        if kind in ("text", "input_text", "refusal") or (kind is None and "text" in part):
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise InvalidRequest(f"Content part {path}.{i} has no text", f"{path}.{i}")
            texts.append(text)
        elif images and kind == "image_url":
            texts.append(None)
        elif kind in IMAGE_PART_TYPES:
            raise MultimodalContent(path)
        else:
            raise InvalidRequest(f"Unknown part type: {kind}", f"{path}.{i}")
    return texts


class MultimodalContent(InvalidRequest):
    """A message carries media; the render path for text-only models refuses it."""

    def __init__(self, path: str) -> None:
        super().__init__("image content in a text-only render path", path)


# The message fields vLLM's conversation keeps (parse_chat_message_content); others, such
# as DeepSeek's assistant `prefix`, never reach the template.
_ANY_ROLE_KEYS = frozenset({"name", "task"})
_PASSED_KEYS: dict[Any, frozenset[str]] = {
    "assistant": _ANY_ROLE_KEYS | {"tool_calls", "reasoning"},
    "tool": _ANY_ROLE_KEYS | {"tool_call_id"},
    "developer": _ANY_ROLE_KEYS | {"tools"},
}


def build_conversation(
    messages: list[dict[str, Any]],
    content_format: ContentFormat,
    developer_ok: bool,
    image_placeholder: str | None = None,
) -> list[dict[str, Any]]:
    """OpenAI messages -> the ``messages`` a chat template receives (vLLM's conversation).

    With ``image_placeholder`` (a multimodal model), image parts stay in the conversation:
    as ``{"type": "image"}`` parts, or as the placeholder text before the message's text.
    """
    conversation = []
    developer = False
    for index, message in enumerate(messages):
        role = message.get("role")
        developer = developer or role == "developer"
        out: dict[str, Any] = {
            "role": "system" if role == "developer" and not developer_ok else role
        }
        content = message.get("content")
        if content is None:  # vLLM reads a missing content as an empty list of parts
            content = []
        if isinstance(content, list):
            parts = _content_text_parts(
                content, f"messages.{index}.content", image_placeholder is not None
            )
            texts = [t for t in parts if t is not None]
            if role == "tool" and len(texts) == len(parts):
                # vLLM hands a tool result of text parts to every template as one string.
                out["content"] = "\n".join(texts)
            elif content_format == "openai":
                out["content"] = [
                    {"type": "image"} if t is None else {"type": "text", "text": t} for t in parts
                ]
            elif len(texts) < len(parts):
                images = [str(image_placeholder)] * (len(parts) - len(texts))
                out["content"] = "\n".join([*images, "\n".join(texts)])
            else:
                out["content"] = "\n".join(texts)
        else:
            out["content"] = content
        for key, value in message.items():
            if key == "reasoning_content":
                key = "reasoning"
            if key not in _PASSED_KEYS.get(role, _ANY_ROLE_KEYS):
                continue
            if key == "tool_calls" and isinstance(value, list):
                value = [_template_tool_call(call) for call in value]
            if key in ("name", "task") and not isinstance(value, str):
                continue
            if value is not None:
                out[key] = value
        if role == "assistant" and "reasoning" in out:
            out.setdefault("reasoning_content", out["reasoning"])
        if role == "developer" and not developer_ok:
            out.pop("tools", None)
        conversation.append(out)
    if not developer_ok and developer:
        return _consolidate_system(conversation)
    return conversation


def _consolidate_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM merges every system message into one at the front once developer became system."""
    texts: list[str] = []
    rest: list[dict[str, Any]] = []
    needed = False
    for index, message in enumerate(conversation):
        if message["role"] != "system":
            rest.append(message)
            continue
        needed = needed or index > 0 or bool(texts)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            texts.append(content)
    if not needed:
        return conversation
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def _template_tool_call(call: Any) -> Any:
    """Templates expect parsed arguments; OpenAI sends them as a JSON string."""
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            return call
        except RecursionError:
            raise InvalidRequest(
                "tool call arguments are nested too deeply to render", "messages"
            ) from None
        return {**call, "function": {**function, "arguments": arguments}}
    return call


def filter_template_kwargs(template: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keep the kwargs the template references, as vLLM's resolve_chat_template_kwargs does."""
    used = template_variables(template)
    return {k: v for k, v in kwargs.items() if k in used or k in _ALWAYS_PASSED}


def apply_template(
    special_tokens: Mapping[str, Any],
    template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
    sandbox: TemplateSandbox | None = None,
    known: KnownTemplate | None = None,
) -> str:
    """Render the prompt text; template errors become 400s with the template's message.

    ``special_tokens`` is the tokenizer's special-token map (the template sees each as a
    variable). With a ``sandbox`` (for per-request templates) the render runs in a killable
    child process; ``known`` is the template's plain-Python renderer (known_templates), if any.
    """
    if "chat_template" in kwargs or "tokenize" in kwargs:
        raise InvalidRequest("chat_template_kwargs must not set 'chat_template' or 'tokenize'")
    call_kwargs = filter_template_kwargs(template, kwargs)
    if sandbox is not None:
        if call_kwargs.get("continue_final_message") and call_kwargs.get("add_generation_prompt"):
            raise InvalidRequest(
                "continue_final_message and add_generation_prompt are not compatible."
            )
        return sandbox.render(template, conversation, tools, {**special_tokens, **call_kwargs})
    try:
        return chat_jinja.render_chat(
            template, conversation, tools, special_tokens, call_kwargs, known
        )
    except jinja2.TemplateError as exc:
        raise InvalidRequest(str(exc)) from exc
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        ArithmeticError,  # a template's arithmetic on request values, its range limit
        RecursionError,  # deeply nested request values
    ) as exc:
        raise InvalidRequest(f"chat template failed: {exc}") from exc


def template_kwargs(
    request: ChatCompletionRequest | TokenizeChatRequest, settings: Settings
) -> dict[str, Any]:
    """vLLM's chat_template_kwargs: server defaults < request kwargs < top-level request fields."""
    effort = reasoning_effort(request, settings)
    user_kwargs = dict(request.chat_template_kwargs or {})
    if "chat_template" in user_kwargs and not settings.trust_request_chat_template:
        raise untrusted_template()
    merged: dict[str, Any] = {
        **VLLM_DEFAULT_TEMPLATE_KWARGS,
        **(settings.default_chat_template_kwargs or {}),
    }
    merged.update(user_kwargs)
    merged["add_generation_prompt"] = request.add_generation_prompt
    merged["continue_final_message"] = request.continue_final_message
    if request.documents is not None:
        merged["documents"] = request.documents
    if effort is not None:
        merged["reasoning_effort"] = effort
        if "enable_thinking" not in user_kwargs:
            merged["enable_thinking"] = effort != "none"
    return merged


def reasoning_effort(
    request: ChatCompletionRequest | TokenizeChatRequest, settings: Settings
) -> str | None:
    """The request's `reasoning_effort` after the server's `--reasoning-effort-map`."""
    if not isinstance(request, ChatCompletionRequest) or request.reasoning_effort is None:
        return None
    effort = request.reasoning_effort
    return str((settings.reasoning_effort_map or {}).get(effort, effort))


def untrusted_template() -> InvalidRequest:
    """A request brings its own chat template to a server that does not allow it."""
    return InvalidRequest(
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template."
    )
