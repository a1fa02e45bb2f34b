"""Multi-turn conversations for training: extend a conversation's ids, per-token loss masks.

Both work from the chat template alone (no ``{% generation %}`` markers): a message's span is
found by rendering the conversation up to it, as vLLM's speculators data preparation does.
Where the template renders earlier turns differently once the conversation goes on (Qwen3
drops the reasoning of turns before the last user message), the result says so instead of
silently diverging from a full re-render.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from render_service.errors import InvalidRequest
from render_service.model import templating
from render_service.protocol.chat import ChatCompletionRequest
from render_service.render import chat
from render_service.validation import convert

if TYPE_CHECKING:
    from render_service.render.renderer import Renderer


class Extension(msgspec.Struct, frozen=True, kw_only=True):
    """``Renderer.extend``'s answer.

    ``token_ids`` is the conversation so far, verbatim, then ``new_token_ids``: the new messages
    and the next generation prompt as the template renders them. ``history_stable`` is true when
    ``token_ids`` equals a full re-render of the whole conversation; otherwise
    ``first_difference`` is the first position where the re-render differs.
    """

    token_ids: list[int]
    new_token_ids: list[int]
    history_stable: bool
    first_difference: int | None = None


class LossMask(msgspec.Struct, frozen=True, kw_only=True):
    """Per token of a rendered conversation: the message it came from and whether it trains.

    ``message_index[i]`` is the index of the message token ``i`` belongs to (a template's preamble
    counts as part of the first message); ``trainable[i]`` is true for the tokens an assistant
    message generated (its text through its end-of-turn token, not the role header before it nor
    the separator after). ``boundaries[k]`` is the end (exclusive) of message ``k``. With
    ``history_stable`` false a prefix of the conversation does not render as a prefix of the
    whole (the template rewrites earlier turns): ``first_difference`` is where the first such
    prefix departs, and later spans are found from the turn structure instead.
    """

    token_ids: list[int]
    message_index: list[int]
    trainable: list[bool]
    boundaries: list[int]
    history_stable: bool
    first_difference: int | None = None


def as_chat_request(request: ChatCompletionRequest | dict[str, Any]) -> ChatCompletionRequest:
    if isinstance(request, dict):
        return convert(request, ChatCompletionRequest, "body")
    return request


class _Texts:
    """Renders message lists of one request (its tools and template kwargs) to text and ids."""

    def __init__(self, renderer: Renderer, request: ChatCompletionRequest) -> None:
        # Harmony and Mistral's request format render only a conversation the model answers
        # next (with its generation prompt): no history to compare.
        if renderer.model.harmony is not None:
            raise InvalidRequest(
                "extend and loss_mask need a chat template; this model renders with Harmony"
            )
        if renderer.model.mistral is not None:
            raise InvalidRequest(
                "extend and loss_mask need a chat template; this model renders with "
                "mistral_common (--tokenizer-mode mistral)"
            )
        self.renderer = renderer
        self.request = request
        self.tools = chat.template_tools(renderer, request)
        self.kwargs = templating.template_kwargs(request, renderer.settings)
        self.kwargs["continue_final_message"] = False

    def text(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        view = msgspec.structs.replace(
            self.request,
            messages=messages,
            add_generation_prompt=generation_prompt,
            continue_final_message=False,
        )
        kwargs = {**self.kwargs, "add_generation_prompt": generation_prompt}
        return chat.prompt_text(self.renderer, view, self.tools, kwargs)

    def ids(self, text: str) -> list[int]:
        add_special = self.request.add_special_tokens
        return self.renderer.prompts.encode(text, add_special, None, None, False).token_ids

    def continuation_ids(self, text: str) -> list[int]:
        """Ids of text that follows a special token (so it tokenizes on its own)."""
        return self.renderer.prompts.encode(text, False, None, None, False).token_ids


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _end_ids(renderer: Renderer) -> frozenset[int]:
    info = renderer.model.info
    ids = set(info.eos_token_ids)
    if info.eos_token_id is not None:
        ids.add(info.eos_token_id)
    return frozenset(ids)


def _nth_end(text: str, marker: str, n: int) -> int | None:
    """The position just after the ``n``-th (1-based) occurrence of ``marker`` in ``text``."""
    position = -1
    for _ in range(n):
        position = text.find(marker, position + 1)
        if position < 0:
            return None
    return position + len(marker)


def extend(
    renderer: Renderer,
    conversation_ids: list[int],
    new_messages: list[dict[str, Any]],
    request: ChatCompletionRequest | dict[str, Any],
) -> Extension:
    """The conversation's ids verbatim, then the new messages and the next generation prompt.

    ``request.messages`` is the conversation ``conversation_ids`` stands for (its prompt and the
    assistant replies generated so far, as messages); its tools and template kwargs apply.
    """
    request = as_chat_request(request)
    texts = _Texts(renderer, request)
    history = list(request.messages)
    base = texts.text(history, False)
    full = texts.text([*history, *new_messages], True)
    full_ids = texts.ids(full)
    end_ids = _end_ids(renderer)
    marker = ""
    if conversation_ids and conversation_ids[-1] in end_ids:
        marker = renderer.model.decode([conversation_ids[-1]], skip_special_tokens=False)
    start = _new_part(base, full, marker)
    if start is not None:
        new_ids = texts.continuation_ids(full[start:])
    else:
        new_ids = full_ids[_new_part_by_specials(renderer, texts.ids(base), full_ids) :]
    token_ids = [*conversation_ids, *new_ids]
    difference = _first_difference(token_ids, full_ids)
    return Extension(
        token_ids=token_ids,
        new_token_ids=new_ids,
        history_stable=difference is None,
        first_difference=difference,
    )


def _new_part(base: str, full: str, marker: str) -> int | None:
    """Where the new messages begin in ``full`` (text), found from the end-of-turn ``marker`` the
    conversation ended with; None when the marker cannot place it."""
    stable = full.startswith(base)
    if not marker:
        return len(base) if stable else None
    if stable and full.startswith(marker, len(base)):
        return len(base) + len(marker)  # the stop token opens the next turn (GLM's <|user|>)
    if marker not in base:
        return None
    # The template closes the turn with text after its end-of-turn token (ChatML's "\n") that
    # the model never generated: it belongs to the new part.
    closing = base[base.rfind(marker) + len(marker) :]
    if stable:
        return len(base) - len(closing)
    # History re-rendered: the new part begins after as many turn ends as history has, or,
    # where the stop token opens the next turn (GLM), after one more.
    count = base.count(marker)
    end = _nth_end(full, marker, count)
    if end is not None and full.startswith(closing, end):
        return end
    return _nth_end(full, marker, count + 1)


def _new_part_by_specials(renderer: Renderer, base_ids: list[int], full_ids: list[int]) -> int:
    """Where the new messages begin in ``full_ids`` when history re-renders with other turn ends
    (gpt-oss: <|return|> generated, <|end|> in history): after as many special tokens as the
    history's rendering has through its last turn end, then its closing ids."""
    special = renderer.model.special_ids()
    last = max((i for i, t in enumerate(base_ids) if t in special), default=-1)
    count = sum(1 for t in base_ids[: last + 1] if t in special)
    closing = len(base_ids) - (last + 1)
    seen = 0
    for i, token in enumerate(full_ids):
        if token in special:
            seen += 1
            if seen == count:
                return min(i + 1 + closing, len(full_ids))
    return len(full_ids)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def loss_mask(renderer: Renderer, request: ChatCompletionRequest | dict[str, Any]) -> LossMask:
    """The rendered conversation (no generation prompt) with each token's message and role."""
    request = as_chat_request(request)
    texts = _Texts(renderer, request)
    messages = list(request.messages)
    full_ids = texts.ids(texts.text(messages, False))
    end_ids = _end_ids(renderer)
    specials = renderer.model.special_ids()
    boundaries: list[int] = []
    trainable = [False] * len(full_ids)
    stable = True
    difference: int | None = None
    previous = 0
    for k, message in enumerate(messages):
        prefix = _prefix_ids(texts, messages[: k + 1], False)
        split = None if prefix is None else _first_difference(prefix, full_ids)
        if k == len(messages) - 1:
            end = len(full_ids)
        elif prefix is None:
            # The template refuses this prefix alone (Llama 3.1's tools need a user message):
            # the message renders inside the next one's span.
            end = previous
        elif split is None or split == len(prefix):
            end = len(prefix)
        elif split >= previous and message.get("role") != "assistant":
            # The template closes a group the next message continues (Qwen2.5 puts consecutive
            # tool results in one turn): the message ends where its rendering closes it.
            end = split
        else:
            if stable:
                stable = False
                difference = split
            end = _aligned_end(prefix, full_ids, previous, end_ids, specials)
        if message.get("role") == "assistant":
            start = _assistant_start(texts, messages[:k], full_ids, previous)
            stop = _last_end(full_ids, start, end, end_ids)
            for i in range(start, stop):
                trainable[i] = True
        boundaries.append(end)
        previous = end
    index = [0] * len(full_ids)
    begin = 0
    for k, end in enumerate(boundaries):
        for i in range(begin, end):
            index[i] = k
        begin = max(begin, end)
    return LossMask(
        token_ids=full_ids,
        message_index=index,
        trainable=trainable,
        boundaries=boundaries,
        history_stable=stable,
        first_difference=difference,
    )


def _prefix_ids(
    texts: _Texts, messages: list[dict[str, Any]], generation_prompt: bool
) -> list[int] | None:
    """The ids of a prefix of the conversation; None when the template refuses it alone."""
    try:
        return texts.ids(texts.text(messages, generation_prompt))
    except InvalidRequest:
        return None


def _assistant_start(
    texts: _Texts,
    before: list[dict[str, Any]],
    full_ids: list[int],
    previous: int,
) -> int:
    """Where an assistant message's generated tokens begin: after the generation prompt, as far
    as the whole has it (a prompt that also opens reasoning, DeepSeek-R1's "<think>\n", departs
    where the message's own text begins)."""
    prompt = _prefix_ids(texts, before, True) if before else None
    if prompt is None:
        return previous
    shared = _first_difference(prompt, full_ids)
    if shared is None or shared >= previous:
        return len(prompt) if shared is None else shared
    # The template rewrote earlier turns: the message opens with the header the generation
    # prompt adds, as far as the whole has it.
    plain = _prefix_ids(texts, before, False)
    header = prompt[len(plain) :] if plain and prompt[: len(plain)] == plain else []
    n = 0
    while n < len(header) and previous + n < len(full_ids) and full_ids[previous + n] == header[n]:
        n += 1
    return previous + n


def _last_end(full_ids: list[int], start: int, end: int, end_ids: frozenset[int]) -> int:
    """The span's end just after its last end-of-turn token (the template's separator after it
    was never generated); the whole span when it has none."""
    for i in range(end - 1, start - 1, -1):
        if full_ids[i] in end_ids:
            return i + 1
    return end


def _aligned_end(
    prefix: list[int],
    full_ids: list[int],
    previous: int,
    end_ids: frozenset[int],
    specials: frozenset[int],
) -> int:
    """Where the end of ``prefix`` falls in ``full_ids`` when the whole re-renders part of the
    history (drops or rewrites earlier turns' reasoning or turn ends).

    The rewrite lies before the message's own text, so the whole, cut at the right place, ends
    with the longest run of the prefix's last ids: the first such place after ``previous``. A
    prefix whose closing the whole does not have there (a group the next message continues, or
    a turn end rewritten as another special token, gpt-oss's <|return|> as <|end|>) is matched
    without it; a rewritten turn end and the separator after it stay with the message.
    Costs a scan of the whole per message: only templates that rewrite history take it.
    """
    shared = _first_difference(prefix, full_ids) or 0
    closed = max((i for i in range(shared, len(prefix)) if prefix[i] in end_ids), default=None)
    best, end, trimmed = 0, previous, False
    # Without its closing the prefix's last id may also differ: the tokenizer merges it with
    # what follows in the whole (Qwen3 and MiniMax group tool results: "</response>\n<").
    tails = (prefix,) if closed is None else (prefix, prefix[:closed], prefix[: closed - 1])
    for tail in tails:
        if not tail:
            continue
        last = tail[-1]
        for x in range(max(previous, 1), len(full_ids) + 1):
            if full_ids[x - 1] != last:
                continue
            n = 1
            while n < len(tail) and n < x and tail[-1 - n] == full_ids[x - 1 - n]:
                n += 1
            if n > best:
                best, end, trimmed = n, x, tail is not prefix
    if trimmed and closed is not None and end < len(full_ids) and full_ids[end] in specials:
        end += 1
        for token in prefix[closed + 1 :]:
            if end >= len(full_ids) or full_ids[end] != token:
                break
            end += 1
    return end
