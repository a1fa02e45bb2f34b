"""Mistral tool calls before tokenizer v11: `[TOOL_CALLS][{"name": …, "arguments": {…}}]` (vLLM `mistral`).

Format (mistral-common's `InstructTokenizerV3`, which writes assistant calls this way,
https://github.com/mistralai/mistral-common/blob/main/src/mistral_common/tokens/tokenizers/instruct.py;
Mistral-Nemo-Instruct-2407 uses tekken v3): the `[TOOL_CALLS]` control token, then a JSON
list of call objects, read by the shared call-list scanner (`_call_list.py`); nothing closes
the list but its `]`. With `tool_choice` "required" or a named tool vLLM constrains the
answer to that list without the token, so there the answer itself may be the list.

Call ids are 9 letters and digits, as Mistral's format requires of ids in the history;
vLLM draws them at random, here they are derived from (request, choice, call index) like
every family's ids, so a retried chunk gets the same id.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from parsers.events import Event
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ReasoningFamily, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments
from parsers.tools._call_list import CallList, close, scan

__all__ = ["MistralCalls", "MistralTools", "build", "mistral_call_id"]

_ALPHANUMERIC = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_ID_LENGTH = 9


class MistralCalls(CallList, FamilyState, frozen=True, tag="mistral", gc=False):
    """One `[TOOL_CALLS]` section (or the answer, under a forced tool choice)."""


class MistralTools(ToolFamily, frozen=True):
    """The `[TOOL_CALLS]` token id of one tokenizer, and the request's tool choice."""

    start_id: int
    start_text: str = "[TOOL_CALLS]"
    forced: bool = False  # tool_choice "required" or a named tool: the answer may be the list
    family: str = "mistral"

    #: vLLM's Mistral adjust_request keeps special tokens whenever tools apply.
    keeps_special_tokens: ClassVar[bool] = True
    #: The section runs to the end of output and gives back text after the list itself.
    drops_text_after_calls: ClassVar[bool] = False
    #: vLLM's pre-v11 streaming sends every chunk of a plain answer as content, empty or not.
    empty_content_deltas: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """`[TOOL_CALLS]` opens a section; no token closes it."""
        return (Marker(self.start_id, self.start_text, "start"),)

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> MistralTools:
        """Remember whether vLLM forced the call list on this answer."""
        forced = request.effective_tool_choice in ("required", "named")
        return self if forced == self.forced else MistralTools(self.start_id, forced=forced)

    def begin(self, index: int) -> MistralCalls:
        """After `[TOOL_CALLS]`: the list follows."""
        return MistralCalls(index=index)

    def begin_answer(self, index: int) -> MistralCalls | None:
        """Under a forced tool choice the answer may be the bare list."""
        return MistralCalls(index=index) if self.forced else None

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more of the list."""
        if not isinstance(call, MistralCalls):
            return call, []
        return scan(call, text)

    def close(self, call: FamilyState) -> list[Event]:
        """End of output (or another `[TOOL_CALLS]`): end an open call, give back held text."""
        return close(call) if isinstance(call, MistralCalls) else []

    def render_adjustments(self, request: ParseRequest, strict_level: str) -> RenderAdjustments:
        """vLLM's pre-v11 adjust_request: keep special tokens; force the list's JSON schema."""
        if not request.tools or request.effective_tool_choice == "none":
            return RenderAdjustments()
        return RenderAdjustments(skip_special_tokens=False, json_schema=_forced_schema(request))

    def call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        """9 letters and digits, derived from (request, choice, call index)."""
        return mistral_call_id(request_id, choice_index, tool_index)


def build(facts: TokenizerFacts) -> MistralTools:
    """Mistral configuration for this tokenizer (vLLM requires `[TOOL_CALLS]`)."""
    return MistralTools(start_id=facts.marker_id("[TOOL_CALLS]", "mistral"))


def mistral_call_id(request_id: str, choice_index: int, tool_index: int) -> str:
    """A 9-character alphanumeric id that is the same for the same call of the same stream."""
    key = f"{request_id}\x1f{choice_index}\x1f{tool_index}".encode()
    number = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    chars = []
    for _ in range(_ID_LENGTH):
        number, digit = divmod(number, len(_ALPHANUMERIC))
        chars.append(_ALPHANUMERIC[digit])
    return "".join(chars)


def _forced_schema(request: ParseRequest) -> dict[str, Any] | None:
    """The JSON schema vLLM forces for "required" or a named tool (`[{"name", "arguments"}]`)."""
    choice = request.effective_tool_choice
    if choice not in ("required", "named"):
        return None
    tools = [t.get("function") or {} for t in request.tools or [] if t.get("type") == "function"]
    extra: dict[str, Any] = {}
    if choice == "named":
        tools = [t for t in tools if t.get("name") == request.named_tool]
        if not tools:
            return None
        extra["maxItems"] = 1
    any_of = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.get("name")]},
                "arguments": t.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return {"type": "array", "minItems": 1, **extra, "items": {"type": "object", "anyOf": any_of}}
