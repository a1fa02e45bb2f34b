"""Loading golden vLLM 0.33.0 derender cases and feeding them through a ChatParser."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from parsers import (
    ChatParser,
    ChatState,
    ContentDelta,
    Event,
    ParseRequest,
    ReasoningDelta,
    TokenizerFacts,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    build_chat_parser,
)

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
GOLDEN = SHARED / "golden"
MODELS = SHARED / "models"
PARSER_DIRS = ("qwen3", "qwen2.5-instruct", "deepseek-r1-distill-qwen", "llama-3.1-instruct")


def shared_present() -> bool:
    return GOLDEN.is_dir() and MODELS.is_dir()


def chat_cases(directory: str | None = None) -> list[Path]:
    """Paths of the chat derender cases (not derr_*) under the parser directories."""
    if not shared_present():
        return []
    dirs = (directory,) if directory else PARSER_DIRS
    out = []
    for d in dirs:
        for path in sorted((GOLDEN / d / "derender").glob("*.json")):
            if path.name.startswith("derr_"):
                continue
            if json.loads(path.read_text()).get("kind") == "chat":
                out.append(path)
    return out


@cache
def tokenizer(model: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODELS / model / "tokenizer.json"))


@cache
def facts(model: str) -> TokenizerFacts:
    decoder = tokenizer(model).get_added_tokens_decoder()
    return TokenizerFacts.from_added_tokens(
        {tok.content: tid for tid, tok in decoder.items()},
        (tid for tid, tok in decoder.items() if tok.special),
    )


def model_dir(case: dict[str, Any]) -> str:
    """The model directory of a case (the served name is the directory name)."""
    return str(case["model"])


def flag(flags: Sequence[str], name: str) -> str | None:
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
    return None


def parse_request(case: dict[str, Any]) -> ParseRequest:
    chat = case["request"].get("chat_request") or {}
    return ParseRequest(
        tools=chat.get("tools"),
        tool_choice=chat.get("tool_choice"),
        parallel_tool_calls=chat.get("parallel_tool_calls", True),
        include_reasoning=chat.get("include_reasoning", True),
        chat_template_kwargs=chat.get("chat_template_kwargs") or {},
        enable_auto_tools="--enable-auto-tool-choice" in case["server_flags"],
    )


def chat_parser(case: dict[str, Any]) -> ChatParser:
    flags = case["server_flags"]
    parser = build_chat_parser(
        flag(flags, "--reasoning-parser"),
        flag(flags, "--tool-call-parser"),
        facts(model_dir(case)),
        parse_request(case),
    )
    assert parser is not None
    return parser


def output_ids(case: dict[str, Any], choice: int = 0) -> list[int]:
    """Output ids without the stop token, which vLLM never detokenizes."""
    out = case["output"][choice]
    ids = list(out["token_ids"])
    chat = case["request"].get("chat_request") or {}
    stop_ids = set(facts(model_dir(case)).special_ids) | set(chat.get("stop_token_ids") or [])
    reason = out.get("stop_reason")
    if isinstance(reason, int):
        stop_ids.add(reason)
    if (
        out["finish_reason"] == "stop"
        and not isinstance(reason, str)
        and ids
        and ids[-1] in stop_ids
    ):
        ids.pop()
    return ids


def split(ids: Sequence[int], sizes: Sequence[int]) -> Iterator[list[int]]:
    pos = 0
    for size in sizes:
        yield list(ids[pos : pos + size])
        pos += size
    if pos < len(ids):
        yield list(ids[pos:])


def chunk_texts(model: str, chunks: Sequence[Sequence[int]]) -> list[str]:
    """Text of each chunk as a streaming detokenizer gives it: whole-sequence decodes, with an
    incomplete trailing character (U+FFFD) held back until its bytes arrive. A test oracle,
    quadratic on purpose; the real incremental detokenizer lives elsewhere."""
    tok = tokenizer(model)
    ids: list[int] = []
    sent = 0
    texts = []
    for k, chunk in enumerate(chunks):
        ids.extend(chunk)
        full = tok.decode(ids, skip_special_tokens=False)
        stable = full if k == len(chunks) - 1 else full.rstrip("\ufffd")
        texts.append(stable[sent:])
        sent = max(sent, len(stable))
    return texts


def run(
    parser: ChatParser, model: str, prompt: Sequence[int], chunks: Sequence[Sequence[int]]
) -> list[Event]:
    """Feed chunks with their streamed text and finish."""
    state = parser.start(prompt)
    events: list[Event] = []
    for chunk, text in zip(chunks, chunk_texts(model, chunks), strict=True):
        state, evs = parser.feed(state, chunk, text)
        events.extend(evs)
    state, evs = parser.finish(state)
    events.extend(evs)
    return events


@dataclass
class Message:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, args]
    ended: set[int] = field(default_factory=set)

    def calls(self, parallel: bool = True) -> list[tuple[str, str]]:
        return [
            (name, args)
            for index, (name, args) in sorted(self.tool_calls.items())
            if parallel or index == 0
        ]


def accumulate(events: Sequence[Event]) -> Message:
    msg = Message()
    for ev in events:
        if isinstance(ev, ReasoningDelta):
            msg.reasoning = (msg.reasoning or "") + ev.text
        elif isinstance(ev, ContentDelta):
            msg.content = (msg.content or "") + ev.text
        elif isinstance(ev, ToolCallStart):
            assert ev.index not in msg.tool_calls
            msg.tool_calls[ev.index] = [ev.name, ""]
        elif isinstance(ev, ToolArgsDelta):
            msg.tool_calls[ev.index][1] += ev.text
        elif isinstance(ev, ToolCallEnd):
            msg.ended.add(ev.index)
    return msg


def expected_stream(final: dict[str, Any]) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    calls = [(tc["name"], tc["arguments"]) for tc in final.get("tool_calls") or []]
    return final["reasoning"], final["content"], calls


def expected_batch(choice: dict[str, Any]) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    msg = choice["message"]
    calls = [
        (tc["function"]["name"], tc["function"]["arguments"]) for tc in msg.get("tool_calls") or []
    ]
    return msg.get("reasoning"), msg.get("content"), calls


def ours(msg: Message, parallel: bool) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    return msg.reasoning, msg.content, msg.calls(parallel)


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def final_state(
    parser: ChatParser, model: str, prompt: Sequence[int], ids: Sequence[int]
) -> ChatState:
    tok = tokenizer(model)
    state = parser.start(prompt)
    state, _ = parser.feed(state, ids, tok.decode(list(ids), skip_special_tokens=False))
    state, _ = parser.finish(state)
    return state


#: Where our answer is, on purpose, not what vLLM streamed for a chunking: the reference
#: our result must equal instead ("batch" or "stream:<chunking>"; "own" when no vLLM answer
#: equals ours and the family's test states it) and why.
Divergences = dict[tuple[str, str], tuple[str, str]]


def check_case(path: Path, stream_div: Divergences, batch_div: Divergences) -> None:
    """Compare our parse of one golden chat case with vLLM's, honouring declared divergences."""
    case = load(path)
    parser = chat_parser(case)
    model = model_dir(case)
    chat = case["request"].get("chat_request") or {}
    parallel = chat.get("parallel_tool_calls", True) is not False
    prompt = case["prompt_token_ids"]
    chunkings = case.get("stream", {}).get("chunkings", {})

    def reference(ref: str, choice: int) -> tuple[str | None, str | None, list[tuple[str, str]]]:
        if ref == "batch":
            return expected_batch(case["response"]["choices"][choice])
        return expected_stream(chunkings[ref.removeprefix("stream:")]["final"])

    for name, chunking in chunkings.items():
        if chunking["final"].get("error"):
            continue  # vLLM refused the stream (stop strings): nothing to parse
        ids = output_ids(case)
        got = ours(
            accumulate(run(parser, model, prompt, list(split(ids, chunking["chunk_sizes"])))),
            parallel,
        )
        div = stream_div.get((path.stem, name))
        if div is not None and div[0] == "own":
            continue  # no vLLM answer equals ours: the family's test states it
        want = reference(div[0], 0) if div else expected_stream(chunking["final"])
        assert got == want, (path.stem, name, div)
    for i, choice in enumerate(case["response"].get("choices", [])):
        ids = output_ids(case, i)
        text = tokenizer(model).decode(ids, skip_special_tokens=False)
        batch = parser.parse_batch(prompt, ids, text)
        calls = [(c.name, c.arguments) for c in batch.tool_calls if parallel or c.index == 0]
        got = (batch.reasoning, batch.content, calls)
        div = batch_div.get((path.stem, "batch"))
        if div is not None and div[0] == "own":
            continue
        if div is None:
            assert got == expected_batch(choice), (path.stem, "batch")
        elif div[0] == "prefix":
            # Stop strings are cut by the derender layer, after parsing.
            assert (got[1] or "").startswith(expected_batch(choice)[1] or ""), path.stem
        else:
            assert got == reference(div[0], i), (path.stem, "batch", div)
