"""Deterministic bench inputs: chat prompts of a target token length and realistic output ids.

Prompts are measured with the model's own tokenizer and chat template (transformers), so "~9k
tokens" is the rendered length. Output ids imitate a qwen3 + hermes turn, built the way the golden
corpus builds them (each segment encoded on its own, markers becoming their special ids):
`<think>` reasoning `</think>` answer, one hermes `<tool_call>{...}</tool_call>`, `<|im_end|>`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

# Plain ASCII words: no quotes or backslashes, so filler can sit inside a JSON string argument.
_PHRASES = (
    "the service renders requests into token ids and turns generated ids back into",
    "messages while a scheduler keeps every worker busy and the cache holds recent",
    "prefixes for reuse engineers measure latency throughput memory and cost across",
    "several machines in a cluster each report lists the median the tail the spread and",
    "the conditions of the run in detail a careful reader checks the units the sample",
    "size and whether the numbers were repeated river mountain village harbour library",
    "market garden bridge station museum tower valley quickly slowly carefully often",
    "rarely never always together apart early late again seven eleven hundred thousand",
    "second minute hour morning evening winter summer north south",
)
_WORDS = [word for phrase in _PHRASES for word in phrase.split()]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web and return the top results.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email on behalf of the user.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "array", "items": {"type": "string"}},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                },
                "required": ["to", "subject", "body"],
            },
        },
    },
]


def filler_text(words: int, seed: int) -> str:
    """Sentences of pseudo-random words; the same seed gives the same text."""
    rng = random.Random(seed)
    sentences = []
    left = words
    while left > 0:
        size = min(left, rng.randint(6, 18))
        sentence = " ".join(rng.choice(_WORDS) for _ in range(size))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        left -= size
    return " ".join(sentences)


class Tokenizer:
    """The model's HF tokenizer, loaded offline; only what the bench needs."""

    def __init__(self, model_dir: Path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        # Typed loosely: transformers' stubs do not describe return_dict results.
        self._tok: Any = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def chat_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        out = self._tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(out["input_ids"])


def chat_messages(tok: Tokenizer, target_tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """A short multi-turn chat whose last user turn carries a document sized to `target_tokens`."""
    base: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Answer concisely."},
        {"role": "user", "content": "I will send you a report. Keep the key numbers in mind."},
        {"role": "assistant", "content": "Understood. Send the report when ready."},
    ]
    question = "\n\nSummarise the report above in three sentences and name its main risk."
    overhead = len(tok.chat_ids([*base, {"role": "user", "content": question}], None))
    doc_ids = tok.encode(filler_text(int(target_tokens * 0.9) + 64, seed))
    doc = tok.decode(doc_ids[: max(1, target_tokens - overhead)])
    return [*base, {"role": "user", "content": doc + question}]


def conversation(turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """The messages of each turn of one conversation: turn k is turn k-1's messages, the
    assistant's reply to it and a new user message (a system prompt opens it)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. " + filler_text(80, seed)}
    ]
    out = []
    for turn in range(turns):
        if turn:
            reply = filler_text(120, seed * 1000 + 2 * turn + 1)
            messages = [*messages, {"role": "assistant", "content": reply}]
        question = filler_text(60, seed * 1000 + 2 * turn) + " What follows?"
        messages = [*messages, {"role": "user", "content": question}]
        out.append(messages)
    return out


def chat_request(
    model: str, messages: list[dict[str, Any]], tools: bool, stream: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = TOOLS
    if stream:
        body["stream"] = True
    return body


def output_ids(tok: Tokenizer, n: int, seed: int = 1) -> list[int]:
    """`n` output ids of a qwen3 turn: reasoning, answer, one hermes tool call, `<|im_end|>`."""
    head = tok.encode("<think>") + tok.encode("\n")
    mid = tok.encode("\n") + tok.encode("</think>") + tok.encode("\n\n")
    call_open = (
        tok.encode("\n\n")
        + tok.encode("<tool_call>")
        + tok.encode(
            '\n{"name": "send_email", "arguments": {"to": ["ops@example.com"], '
            '"subject": "Weekly summary", "body": "'
        )
    )
    call_close = tok.encode('"}}\n') + tok.encode("</tool_call>") + tok.encode("<|im_end|>")
    budget = n - len(head) - len(mid) - len(call_open) - len(call_close)
    if budget < 3:
        raise ValueError(f"n={n} is too small for a reasoning, answer and tool-call turn")
    reasoning_len = budget // 2
    answer_len = (budget * 3) // 10
    body_len = budget - reasoning_len - answer_len
    fill = tok.encode(filler_text(budget + 64, seed))
    while len(fill) < budget:
        fill += fill
    ids = (
        head
        + fill[:reasoning_len]
        + mid
        + fill[reasoning_len : reasoning_len + answer_len]
        + call_open
        + fill[reasoning_len + answer_len : budget]
        + call_close
    )
    assert len(ids) == n and body_len > 0
    return ids
