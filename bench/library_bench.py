"""The library against the chat-template libraries RL teams use, one core, in one run.

    PYTHONPATH=. python bench/library_bench.py --peers-python /tmp/peers/bin/python

Systems: render-service (``Renderer.tokenize``), transformers'
``apply_chat_template(tokenize=True)``, PrimeIntellect's ``renderers`` and Thinking Machines'
``tml-renderers`` (the peers run from their own venv: ``--peers-python``). Each system runs in
its own process pinned to one core (``taskset``), on Qwen3 and Llama 3.1 conversations of ~1k and
~9k tokens with reasoning, tool calls and tool results:

- *cold*: every conversation is new (its own system prompt, tools and turns), so no cache of an
  earlier conversation or message can hit: conversations per second;
- *repeated*: one conversation rendered again and again (what a cache makes cheap), apart;
- *load*: a fresh process importing the library and loading the model until its first render:
  wall seconds and peak RSS.

Every system's ids are checked against transformers' for every conversation; a mismatch is
reported in the table. Medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO.parent / "shared" / "models"
SYSTEMS = ("render-service", "transformers", "renderers", "tml-renderers")

WORDS = [
    "the",
    "model",
    "reads",
    "a",
    "long",
    "document",
    "about",
    "distributed",
    "systems",
    "and",
    "answers",
    "questions",
    "about",
    "consensus",
    "replication",
    "latency",
    "throughput",
    "caching",
    "tokenizers",
    "templates",
    "engines",
    "schedulers",
    "memory",
    "bandwidth",
    "kernels",
    "batching",
    "prefill",
    "decode",
    "streaming",
    "parsers",
    "reasoning",
    "tools",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" ({rng.randrange(10**9)})"


def _tools(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{rng.randrange(10**6)}_{i}",
                "description": _text(rng, 12),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": _text(rng, 6)},
                        "limit": {"type": "integer"},
                    },
                    "required": ["query"],
                },
            },
        }
        for i in range(n)
    ]


def conversation(rng: random.Random, size: int, single_call: bool) -> dict[str, Any]:
    """A conversation of about ``size`` tokens: system prompt, tools, user turns, assistant
    turns with reasoning and tool calls, tool results, and a final user turn."""
    tools = _tools(rng, 3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 40)}]
    turns = max(1, size // 350)
    for t in range(turns):
        messages.append({"role": "user", "content": _text(rng, 60)})
        name = tools[t % len(tools)]["function"]["name"]
        calls = 1 if single_call else 1 + t % 2
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": _text(rng, 30),
                "tool_calls": [
                    {
                        "id": f"call{t}{c}",
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": {"query": _text(rng, 4), "limit": c + 1},
                        },
                    }
                    for c in range(calls)
                ],
            }
        )
        for c in range(calls):
            messages.append(
                {"role": "tool", "tool_call_id": f"call{t}{c}", "content": _text(rng, 80)}
            )
        messages.append({"role": "assistant", "content": _text(rng, 40)})
    messages.append({"role": "user", "content": _text(rng, 30)})
    return {"messages": messages, "tools": tools}


def workload(model: str, size: int, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [conversation(rng, size, single_call=model.startswith("llama")) for _ in range(count)]


# ---- systems (each runs inside its own process) -------------------------------------------


def _openai_messages(conv: dict[str, Any]) -> list[dict[str, Any]]:
    """Arguments as JSON strings (the OpenAI wire form render-service takes)."""
    out = []
    for m in conv["messages"]:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def load_system(system: str, model_dir: Path) -> Any:
    """A function conversation -> ids, with the model loaded."""
    if system == "render-service":
        from render_service import Renderer

        renderer = Renderer.from_pretrained(str(model_dir))

        def render(conv: dict[str, Any]) -> list[int]:
            return list(
                renderer.tokenize(
                    {"messages": _openai_messages(conv), "tools": conv["tools"]}
                ).tokens
            )

        return render
    if system == "transformers":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

        def render(conv: dict[str, Any]) -> list[int]:
            out = tokenizer.apply_chat_template(
                conv["messages"], tools=conv["tools"], add_generation_prompt=True, tokenize=True
            )
            ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
            return list(ids)

        return render
    if system == "renderers":
        return _load_renderers(model_dir)
    if system == "tml-renderers":
        return _load_tml(model_dir)
    raise ValueError(system)


def _load_renderers(model_dir: Path) -> Any:
    from renderers import create_renderer  # PrimeIntellect
    from renderers.base import load_tokenizer

    renderer = create_renderer(load_tokenizer(str(model_dir)))

    def render(conv: dict[str, Any]) -> list[int]:
        ids = renderer.render_ids(conv["messages"], tools=conv["tools"], add_generation_prompt=True)
        return list(ids)

    return render


def _load_tml(model_dir: Path) -> Any:
    from tml_renderers import chat, renderers  # Thinking Machines

    if model_dir.name != "qwen3":
        raise SystemExit(f"tml-renderers has no renderer for {model_dir.name}")
    renderer = renderers.Qwen3()

    def render(conv: dict[str, Any]) -> list[int]:
        specs = [
            chat.ToolSpecJson(
                t["type"],
                t["function"]["name"],
                t["function"]["description"],
                t["function"]["parameters"],
            )
            for t in conv["tools"]
        ]
        system = chat.Author(chat.AuthorKind.System)
        declare = chat.Message(content=chat.ToolDeclareJson(specs), author=system)
        messages = [
            *chat.OpenAIMessage.from_messages([declare]),
            *chat.OpenAIMessage.from_oss_messages(_openai_messages(conv)),
        ]
        spans, _ = renderer.render_for_completion(messages)
        return [t for s in spans for t in s.span.tokens]

    return render


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    """Inside one pinned process: load, render every conversation, print one JSON result."""
    data = json.loads(Path(args.data).read_text(encoding="utf-8"))
    start = time.perf_counter()
    render = load_system(args.system, MODELS / args.model)
    first = render(data["cold"][0])
    load_s = time.perf_counter() - start
    load_rss = _rss_mb()
    reference = data["reference"]
    mismatches = sum(render(c) != reference[i] for i, c in enumerate(data["cold"][:5])) + (
        first != reference[0]
    )
    cold = data["cold"]
    t = time.perf_counter()
    for conv in cold:
        render(conv)
    cold_rate = len(cold) / (time.perf_counter() - t)
    repeated = cold[0]
    n = len(cold)
    t = time.perf_counter()
    for _ in range(n):
        render(repeated)
    repeated_rate = n / (time.perf_counter() - t)
    print(
        json.dumps(
            {
                "load_s": load_s,
                "load_rss_mb": load_rss,
                "cold": cold_rate,
                "repeated": repeated_rate,
                "mismatches": mismatches,
            }
        )
    )


def run_one(python: str, system: str, model: str, data: Path, core: int) -> dict[str, Any]:
    command = [
        "taskset", "-c", str(core), python, __file__, "--worker", "--system", system,
        "--model", model, "--data", str(data),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=3600, check=False
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--system", choices=SYSTEMS)
    parser.add_argument("--data")
    parser.add_argument("--model", default="qwen3")
    parser.add_argument("--models", default="qwen3,llama-3.1-instruct")
    parser.add_argument("--sizes", default="1000,9000")
    parser.add_argument("--peers-python", default=None, help="python of the peers' venv")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--count-1k", type=int, default=400)
    parser.add_argument("--count-9k", type=int, default=60)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from transformers import AutoTokenizer

    rows = []
    for model in args.models.split(","):
        tokenizer = AutoTokenizer.from_pretrained(str(MODELS / model))
        for size in (int(s) for s in args.sizes.split(",")):
            count = args.count_1k if size < 5000 else args.count_9k
            cold = workload(model, size, count, seed=size)
            reference = [
                list(
                    tokenizer.apply_chat_template(
                        c["messages"], tools=c["tools"], add_generation_prompt=True, tokenize=True
                    )["input_ids"]
                )
                for c in cold[:6]
            ]
            tokens = statistics.median(len(r) for r in reference)
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump({"cold": cold, "reference": reference}, f)
            data = Path(f.name)
            for system in SYSTEMS:
                python = (
                    sys.executable
                    if system in ("render-service", "transformers")
                    else args.peers_python
                )
                if python is None:
                    continue
                runs = [run_one(python, system, model, data, args.core) for _ in range(args.runs)]
                good = [r for r in runs if "error" not in r]
                row = {"model": model, "tokens": tokens, "system": system}
                if not good:
                    row["error"] = runs[0]["error"]
                else:
                    for key in ("cold", "repeated", "load_s", "load_rss_mb"):
                        row[key] = statistics.median(r[key] for r in good)
                    row["mismatches"] = max(r["mismatches"] for r in good)
                rows.append(row)
                print(json.dumps(row), flush=True)
            data.unlink()
    print(
        "\n| model | tokens | system | cold conv/s | repeated conv/s | load s | RSS MB | ids = transformers |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(
                f"| {r['model']} | {r['tokens']:.0f} | {r['system']} | error: {r['error'][:80]} | | | | |"
            )
            continue
        print(
            f"| {r['model']} | {r['tokens']:.0f} | {r['system']} | {r['cold']:.0f} | "
            f"{r['repeated']:.0f} | {r['load_s']:.2f} | {r['load_rss_mb']:.0f} | "
            f"{'yes' if r['mismatches'] == 0 else 'NO (' + str(r['mismatches']) + ')'} |"
        )


if __name__ == "__main__":
    main()
