"""How often our derender answers equal vLLM 0.33.0's, over the golden corpus in ../shared.

For each directory: the share of chat derender cases whose batch body equals vLLM's batch body
(ids and `created` ignored), and the share of (case, chunking) streams whose accumulated message
equals vLLM's accumulated message. Not a test (the golden tests assert per case, with named
divergences): a rate to quote before and after a change.

    PYTHONPATH=. python bench/golden_conformance.py [DIR ...] [--show]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
MODELS = GOLDEN.parent / "models"
DEFAULT = ["qwen3", "qwen2.5-instruct", "deepseek-r1-distill-qwen", "llama-3.1-instruct"]


def _client(case: dict[str, Any], cache: dict[str, TestClient]) -> TestClient:
    argv = [str(MODELS / case["model"]), "--served-model-name", case["model"]]
    argv += case["server_flags"]
    key = json.dumps(argv)
    if key not in cache:
        cache[key] = TestClient(build_app(Renderer.from_settings(parse_settings(argv))))
    return cache[key]


def _post(client: TestClient, path: str, body: dict[str, Any]) -> Any:
    content = json.dumps(body, ensure_ascii=False).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if k != "created"}
    choices = []
    for choice in body.get("choices") or []:
        choice = dict(choice)
        message = dict(choice.get("message") or {})
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "id"} for c in message["tool_calls"]
            ]
        choice["message"] = message
        choices.append(choice)
    body["choices"] = choices
    return body


def _accumulate(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    reasoning: list[str] = []
    content: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice["delta"]
            if delta.get("reasoning") is not None:
                reasoning.append(delta["reasoning"])
            if delta.get("content") is not None:
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("name"):
                    names[call["index"]] = names.get(call["index"], "") + function["name"]
                args.setdefault(call["index"], []).append(function.get("arguments") or "")
    return {
        "reasoning": "".join(reasoning) if reasoning else None,
        "content": "".join(content) if content else None,
        "tool_calls": [(names.get(i, ""), "".join(args[i])) for i in sorted(args)],
    }


def _final(final: dict[str, Any]) -> dict[str, Any]:
    return {
        "reasoning": final.get("reasoning"),
        "content": final.get("content"),
        "tool_calls": [(c["name"], c["arguments"]) for c in final.get("tool_calls") or []],
    }


def measure(directory: str, show: bool, cache: dict[str, TestClient]) -> tuple[int, int, int, int]:
    """(batch equal, batch cases, streams equal, streams) for one golden directory."""
    batch_ok = batch_n = stream_ok = stream_n = 0
    for path in sorted((GOLDEN / directory / "derender").glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        if case.get("kind") != "chat" or case["status"] != 200:
            continue
        client = _client(case, cache)
        got = _post(client, case["path"], case["request"])
        batch_n += 1
        same = got.status_code == 200 and _comparable(got.json()) == _comparable(case["response"])
        batch_ok += same
        if show and not same:
            want = case["response"]["choices"][0]["message"]
            have = got.json()["choices"][0]["message"] if got.status_code == 200 else got.text
            print(f"  batch  {directory}/{path.stem}\n    vllm {want}\n    ours {have}")
        stream = case.get("stream")
        for chunking, run in (stream or {}).get("chunkings", {}).items():
            state: Any = None
            chunks = []
            for call in run["calls"]:
                body = {**stream["request_base"], "generate_chunk": call["generate_chunk"]}
                response = _post(client, stream["path"], {**body, "stream_state": state})
                if response.status_code != 200:
                    break
                state = response.json()["stream_state"]
                chunks.append(response.json()["chunk"])
            stream_n += 1
            equal = _accumulate(chunks) == _final(run["final"])
            stream_ok += equal
            if show and not equal:
                print(f"  stream {directory}/{path.stem}/{chunking}")
                print(f"    vllm {_final(run['final'])}\n    ours {_accumulate(chunks)}")
    return batch_ok, batch_n, stream_ok, stream_n


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", default=DEFAULT)
    parser.add_argument("--show", action="store_true", help="print every case that differs")
    args = parser.parse_args(argv)
    if not GOLDEN.is_dir():
        sys.exit(f"no golden corpus at {GOLDEN}")
    cache: dict[str, TestClient] = {}
    totals = [0, 0, 0, 0]
    print("| directory | batch = vLLM batch | streams = vLLM stream (accumulated) |")
    print("|---|---|---|")
    for directory in args.directories:
        counts = measure(directory, args.show, cache)
        totals = [t + c for t, c in zip(totals, counts, strict=True)]
        b_ok, b_n, s_ok, s_n = counts
        print(f"| {directory} | {b_ok}/{b_n} ({b_ok / max(b_n, 1):.1%}) "
              f"| {s_ok}/{s_n} ({s_ok / max(s_n, 1):.1%}) |")  # fmt: skip
    b_ok, b_n, s_ok, s_n = totals
    print(f"| all | {b_ok}/{b_n} ({b_ok / max(b_n, 1):.1%}) "
          f"| {s_ok}/{s_n} ({s_ok / max(s_n, 1):.1%}) |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
