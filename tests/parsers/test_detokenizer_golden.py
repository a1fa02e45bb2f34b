"""Per-chunk parity of the incremental detokenizer with vLLM 0.33.0's streaming derender.

Every streaming case of the golden corpus that vLLM derenders without a parser (the
`qwen3-noparser` chat cases, and completion cases wherever they are) records the text vLLM
returned for each generate chunk. Feeding the same chunks to `Detokenizer.step` (and
`finish` on the chunk that carries `finish_reason`) must give the same texts. The stop token
is dropped first, as the derender layer does (golden README, "Derender cases").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from parsers.detokenizer import Detokenizer

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
GOLDEN = SHARED / "golden"
# Directories whose completion cases have no parser; chat cases only where no parser is set.
COMPLETION_DIRS = (
    "qwen3-noparser",
    "qwen2.5-instruct",
    "llama-3.1-instruct",
    "deepseek-r1-distill-qwen",
)
CHAT_DIRS = ("qwen3-noparser",)

pytestmark = pytest.mark.skipif(not GOLDEN.is_dir(), reason="../shared/golden is absent")


def _cases() -> Iterator[Any]:
    if not GOLDEN.is_dir():
        return
    for directory in COMPLETION_DIRS:
        for path in sorted((GOLDEN / directory / "derender").glob("*.json")):
            case = json.loads(path.read_text(encoding="utf-8"))
            kind = case.get("kind")
            if kind == "completion" or (kind == "chat" and directory in CHAT_DIRS):
                yield pytest.param(case, id=f"{directory}/{case['name']}")


class Model:
    """The model facts derender needs: decode, special ids, EOS ids."""

    def __init__(self, name: str) -> None:
        tokenizers = pytest.importorskip("tokenizers")
        directory = SHARED / "models" / name
        self.tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        # For the Qwen tokenizers the added tokens flagged special are exactly transformers'
        # all_special_ids, the set vLLM's streaming path skips.
        self.special_ids = frozenset(
            i for i, t in self.tok.get_added_tokens_decoder().items() if t.special
        )
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        eos = config["eos_token"]
        self.primary_eos = self.tok.token_to_id(eos if isinstance(eos, str) else eos["content"])
        # Some model directories ship no generation_config.json; config.json then names the EOS.
        generation_file = directory / "generation_config.json"
        if not generation_file.is_file():
            generation_file = directory / "config.json"
        generation = json.loads(generation_file.read_text(encoding="utf-8"))
        eos_ids = generation.get("eos_token_id") or []
        self.eos_ids = frozenset(eos_ids if isinstance(eos_ids, list) else [eos_ids])

    def decode(self, ids: Any) -> str:
        text: str = self.tok.decode(list(ids), skip_special_tokens=False)
        return text

    def detokenizer(self, request: dict[str, Any]) -> Detokenizer:
        return Detokenizer(
            self.decode,
            self.special_ids,
            skip_special_tokens=request.get("skip_special_tokens", True),
            spaces_between_special_tokens=request.get("spaces_between_special_tokens", True),
            vocab_size=self.tok.get_vocab_size(),
        )

    def drop_stop_token(
        self, ids: list[int], choice: dict[str, Any], request: dict[str, Any]
    ) -> list[int]:
        """Remove the stop token that ends a "stop" choice, as vLLM's derender does."""
        if not ids or choice.get("finish_reason") != "stop":
            return ids
        if request.get("include_stop_str_in_output"):
            return ids
        reason = choice.get("stop_reason")
        stops = set(request.get("stop_token_ids") or []) | self.eos_ids
        if isinstance(reason, int):
            stops.add(reason)
        elif reason is None:
            stops.add(self.primary_eos)
        return ids[:-1] if ids[-1] in stops else ids


_models: dict[str, Model] = {}


def _model(name: str) -> Model:
    if name not in _models:
        _models[name] = Model(name)
    return _models[name]


@pytest.mark.parametrize("case", list(_cases()))
def test_stream_deltas_match_vllm(case: dict[str, Any]) -> None:
    if "stream" not in case:
        pytest.skip("batch-only case (several choices or prompts)")
    model = _model(case["model"])
    base = case["stream"]["request_base"]
    request = base.get("chat_request") or base.get("completion_request") or {}
    detok = model.detokenizer(request)
    checked = 0
    for chunking in case["stream"]["chunkings"].values():
        state = None
        for call in chunking["calls"]:
            if call["status"] != 200:
                break  # e.g. stop strings, which streaming derender rejects
            choices = call["generate_chunk"]["choices"]
            if not choices:
                continue  # usage-only event
            if state is None:
                prompt = base.get("prompt_token_ids")
                if prompt is None:
                    prompt = call["generate_chunk"].get("prompt_token_ids") or []
                state = detok.start(prompt)
            choice = choices[0]
            ids = model.drop_stop_token(list(choice["token_ids"] or []), choice, request)
            state, text = detok.step(state, ids)
            if choice.get("finish_reason") is not None:
                state, tail = detok.finish(state)
                text += tail
            returned = call["chunk"]["choices"][0]
            if case["kind"] == "chat":
                assert (text or None) == returned["delta"].get("content")
            else:
                assert text == returned["text"]
            checked += 1
    if checked == 0:
        pytest.skip("vLLM rejected the stream on its first call")


@pytest.mark.parametrize("case", list(_cases()))
def test_batch_text_matches_vllm(case: dict[str, Any]) -> None:
    """The non-streaming answer is the same machine fed one chunk."""
    if case.get("status") != 200:
        pytest.skip("vLLM rejected the batch request")
    model = _model(case["model"])
    body = case["request"]
    request = body.get("chat_request") or body.get("completion_request") or {}
    if request.get("stop"):
        pytest.skip("stop strings are cut by the derender layer, not the detokenizer")
    detok = model.detokenizer(request)
    responses = body.get("generate_responses") or [body.get("generate_response")]
    prompts = body.get("prompt_token_ids")
    if case["kind"] == "chat" or prompts is None:
        prompts = [prompts] * len(responses)
    returned = iter(case["response"]["choices"])
    for response, prompt in zip(responses, prompts, strict=True):
        for choice in response["choices"]:
            ids = model.drop_stop_token(list(choice["token_ids"]), choice, request)
            state, text = detok.step(detok.start(prompt or []), ids)
            text += detok.finish(state)[1]
            expected = next(returned)
            if case["kind"] == "chat":
                assert text == expected["message"]["content"]
            else:
                assert text == expected["text"]


def _outputs(tokenizer_file: str = "tokenizer.json") -> Iterator[Any]:
    """Every derendered output of the corpus whose model has `tokenizer_file`."""
    if not GOLDEN.is_dir():
        return
    for directory in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        for path in sorted((directory / "derender").glob("*.json")):
            case = json.loads(path.read_text(encoding="utf-8"))
            if not (SHARED / "models" / case["model"] / tokenizer_file).is_file():
                continue
            for output in case.get("output", []):
                if output["token_ids"]:
                    name = f"{directory.name}/{case['name']}/{output['index']}"
                    yield pytest.param(case["model"], output, id=name)


@pytest.mark.parametrize(("model_name", "output"), list(_outputs()))
@pytest.mark.parametrize("size", [1, 3])
def test_every_golden_output_streams_to_its_text(
    model_name: str, output: dict[str, Any], size: int
) -> None:
    # `text` is tokenizer.decode(token_ids, skip_special_tokens=False) (golden README).
    model = _model(model_name)
    detok = Detokenizer(model.decode, model.special_ids, skip_special_tokens=False)
    ids = output["token_ids"]
    state = detok.start([])
    pieces = []
    for start in range(0, len(ids), size):
        state, text = detok.step(state, ids[start : start + size])
        pieces.append(text)
    pieces.append(detok.finish(state)[1])
    assert "".join(pieces) == output["text"]


@cache
def _tekken(model: str) -> Any:
    pytest.importorskip("mistral_common", reason="the mistral extra is not installed")
    from render_service.model.mistral import MistralTokenizer

    return MistralTokenizer.from_directory(SHARED / "models" / model)


@pytest.mark.parametrize(("model_name", "output"), list(_outputs("tekken.json")))
@pytest.mark.parametrize("size", [1, 3])
def test_every_tekken_output_streams_to_its_text(
    model_name: str, output: dict[str, Any], size: int
) -> None:
    """Tekken through the same window: its one-shot decode, and both of vLLM's stream decodes."""
    tok = _tekken(model_name)
    ids = output["token_ids"]
    decoders = {
        "keep": (tok.decode, output["text"]),  # golden `text`: decode with control tokens kept
        "by_piece": (tok.stream_decoder(False), tok.stream_decoder(False)(ids)),
        "utf8": (tok.stream_decoder(True), tok.stream_decoder(True)(ids)),
    }
    for decode, expected in decoders.values():
        detok = Detokenizer(decode, frozenset(), skip_special_tokens=False)
        state = detok.start([1, 3])
        pieces = []
        for start in range(0, len(ids), size):
            state, text = detok.step(state, ids[start : start + size])
            pieces.append(text)
        pieces.append(detok.finish(state)[1])
        assert "".join(pieces) == expected
