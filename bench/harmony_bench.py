"""Harmony (gpt-oss) streaming derender: server CPU of render-service vs vLLM 0.33.0, one run.

Both servers serve ../shared/models/gpt-oss with `--enable-auto-tool-choice --tool-call-parser
openai` (vLLM picks its `openai_gptoss` reasoning parser itself; so do we) and
`VLLM_SYSTEM_START_DATE=2026-01-01`. vLLM gets `--hf-overrides '{"quantization_config": null}'`
(its config check imports compressed-tensors for the mxfp4 config, which render never uses).
The prompt is rendered by each server and must come out the same. The output is a gpt-oss
answer of n ids: an analysis message, a commentary tool call (`to=functions.send_email
<|constrain|>json`) and a final message, ending with `<|return|>`. Each stream is vLLM's
documented client loop, one output id per call (`bench.measure.stream_derender`); both systems
must stream the same message. Server CPU is the process tree's utime + stime from /proc.

    PYTHONPATH=. python bench/harmony_bench.py [--sizes 256,1024,4096] [--budget 1200]

Writes bench/results/<UTC date>-harmony.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench import loadgen, measure, peer
from bench.inputs import TOOLS, filler_text
from bench.servers import Server, free_port

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".." / "shared" / "models" / "gpt-oss"
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "openai"]
ENV = {"VLLM_SYSTEM_START_DATE": "2026-01-01"}
TOOL = next(t for t in TOOLS if t["function"]["name"] == "send_email")
CHAT = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Summarise the incident report and email it to the team."},
    ],
    "tools": [TOOL],
}


def gpt_oss_output(encode: Any, n: int) -> list[int]:
    """n ids: analysis (half), a send_email call (a quarter), a final answer, <|return|>."""

    def ids(text: str) -> list[int]:
        return list(encode(text))

    analysis_head = ids("<|channel|>analysis<|message|>")
    call_head = ids(
        "<|end|><|start|>assistant<|channel|>commentary to=functions.send_email"
        " <|constrain|>json<|message|>"
    )
    final_head = ids("<|call|><|start|>assistant<|channel|>final<|message|>")
    tail = ids("<|return|>")
    budget = n - len(analysis_head) - len(call_head) - len(final_head) - len(tail)
    analysis = ids(filler_text(budget, 1))[: budget // 2]
    body = filler_text(budget, 2)
    arguments = ids(json.dumps({"to": ["team@example.com"], "subject": "Incident", "body": body}))
    arguments = arguments[: budget // 4]
    final = ids(filler_text(budget, 3))[: budget - len(analysis) - len(arguments)]
    out = analysis_head + analysis + call_head + arguments + final_head + final + tail
    assert len(out) == n, (len(out), n)
    return out


def start(name: str, cmd: list[str], env: dict[str, str]) -> Server:
    port = free_port()
    cmd = [part.replace("{port}", str(port)) for part in cmd]
    log = REPO / "bench" / ".work" / "logs" / f"harmony-{name}.log"
    return Server(name, cmd, env, MODEL.parent, port, log)


def render(server: Server) -> list[int]:
    response = httpx.post(
        server.base_url + "/v1/chat/completions/render",
        json={"model": "gpt-oss", **CHAT},
        timeout=60,
    )
    response.raise_for_status()
    return list(response.json()["token_ids"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--budget", type=float, default=1200.0, help="seconds per stream")
    parser.add_argument("--vllm-venv", default=None)
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    venv = peer.venv_dir(args.vllm_venv)
    peer.ensure_installed(venv)
    ours_cmd = [
        sys.executable,
        "-m",
        "render_service",
        "serve",
        "gpt-oss",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--state-secret",
        secrets.token_hex(16),
        *FLAGS,
    ]
    vllm_cmd = peer.server_command(venv, Path("gpt-oss"), 0, FLAGS)
    vllm_cmd[vllm_cmd.index("--port") + 1] = "{port}"
    vllm_cmd += ["--hf-overrides", '{"quantization_config": null}']
    ours_env = {**os.environ, **ENV, "PYTHONPATH": str(REPO)}
    servers = {
        "render-service": start("ours", ours_cmd, ours_env),
        "vLLM 0.33.0": start("vllm", vllm_cmd, {**peer.server_env(), **ENV}),
    }
    try:
        for server in servers.values():
            server.wait_healthy(300)
        prompts = {name: render(server) for name, server in servers.items()}
        prompt = prompts["render-service"]
        if prompts["vLLM 0.33.0"] != prompt:
            print("the two servers rendered different prompts", file=sys.stderr)
            return 1
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
        base = {
            "model": "gpt-oss",
            "prompt_tokens": len(prompt),
            "prompt_token_ids": prompt,
            "chat_request": {"model": "gpt-oss", **CHAT, "stream": True},
        }
        rows: list[tuple[int, dict[str, measure.StreamRun]]] = []
        for n in sizes:
            output = gpt_oss_output(lambda t: tokenizer.encode(t, add_special_tokens=False).ids, n)
            runs: dict[str, measure.StreamRun] = {}
            for name, server in servers.items():
                print(f"n={n} {name} ...", flush=True)
                with loadgen.Client(server.base_url, 120) as client:
                    runs[name] = measure.stream_derender(
                        client, server.cpu_seconds, base, output, False, args.budget, f"gen-{n}"
                    )
                run = runs[name]
                print(f"  {run.calls} calls, {run.server_cpu_s:.2f} s CPU, {run.wall_s:.1f} s wall")
            ours, theirs = runs["render-service"].final, runs["vLLM 0.33.0"].final
            if ours is not None and theirs is not None and ours.summary() != theirs.summary():
                print(
                    f"n={n}: the streamed messages differ:\n  {ours.summary()}\n  {theirs.summary()}"
                )
            rows.append((n, runs))
    finally:
        for server in servers.values():
            server.stop()
    report = table(rows)
    print(report)
    out = Path(args.out) / f"{time.strftime('%Y-%m-%d', time.gmtime())}-harmony.md"
    out.write_text(
        "# Harmony (gpt-oss) streaming derender\n\n"
        f"`PYTHONPATH=. python bench/harmony_bench.py --sizes {args.sizes}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.2f}.\n\n" + report + "\n"
    )
    print(f"wrote {out}")
    return 0


def table(rows: list[tuple[int, dict[str, measure.StreamRun]]]) -> str:
    """Server CPU per stream, the ratio, and growth exponents between consecutive sizes."""
    lines = [
        "| chunks (1 id each) | render-service CPU s | vLLM 0.33.0 CPU s | vLLM / ours | "
        "ours growth | vLLM growth | same message |",
        "|---|---|---|---|---|---|---|",
    ]
    previous: tuple[int, float, float] | None = None
    for n, runs in rows:
        ours, theirs = runs["render-service"], runs["vLLM 0.33.0"]
        cut = "" if theirs.outcome.ok else f" ({theirs.outcome.note})"
        ratio = theirs.server_cpu_s / ours.server_cpu_s if ours.server_cpu_s else math.inf
        growth = ("", "")
        if previous is not None:
            n0, ours0, theirs0 = previous
            scale = math.log(n / n0)
            growth = (
                f"n^{math.log(ours.server_cpu_s / ours0) / scale:.2f}" if ours0 else "",
                f"n^{math.log(theirs.server_cpu_s / theirs0) / scale:.2f}" if theirs0 else "",
            )
        same = (
            ours.final is not None
            and theirs.final is not None
            and ours.final.summary() == theirs.final.summary()
        )
        lines.append(
            f"| {n} | {ours.server_cpu_s:.2f} | {theirs.server_cpu_s:.2f}{cut} | {ratio:.0f}x | "
            f"{growth[0]} | {growth[1]} | {'yes' if same else 'no'} |"
        )
        previous = (n, ours.server_cpu_s, theirs.server_cpu_s)
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
