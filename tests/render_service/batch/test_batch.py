"""``render-service batch``: every input line answered once, in order, bad lines as errors with
their line number, a progress bar, and a run killed midway resumed without a duplicate line.

Runs on the embedded default model (no ../shared needed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from render_service.library import Renderer
from render_service.model.default_model import ensure_default_model


def write_requests(path: Path, count: int) -> set[int]:
    """``count`` chat render bodies, 1% of them broken; the numbers of the broken lines."""
    broken = set()
    with path.open("w", encoding="utf-8") as f:
        for n in range(1, count + 1):
            if n % 100 == 50:
                broken.add(n)
                f.write('{"messages": [ not json\n' if n % 200 == 50 else '{"messages": []}\n')
                continue
            body = {
                "messages": [
                    {"role": "system", "content": f"system prompt {n}"},
                    {"role": "user", "content": "word " * (n % 17) + str(n)},
                ]
            }
            f.write(json.dumps(body) + "\n")
    return broken


def run_cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_service", "batch", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        **kwargs,
    )


def read_answers(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_answers(answers: list[dict[str, Any]], source: Path, broken: set[int]) -> None:
    renderer = Renderer.from_pretrained(str(ensure_default_model()))
    bodies = source.read_text(encoding="utf-8").splitlines()
    assert [a["line"] for a in answers] == list(range(1, len(bodies) + 1))
    for answer in answers:
        n = answer["line"]
        if n in broken:
            assert "result" not in answer
            assert answer["error"]["code"] == 400
            continue
        if n % 37 == 1:  # a sample: the ids are the library's ids
            expected = renderer.render_chat(json.loads(bodies[n - 1])).token_ids
            assert answer["result"]["token_ids"] == expected


def test_batch_render_answers_every_line_in_order(tmp_path: Path) -> None:
    source, target = tmp_path / "in put.jsonl", tmp_path / "out.jsonl"
    broken = write_requests(source, 400)
    done = run_cli("render", str(source), str(target), "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert "lines/s" in done.stderr and "400/400" in done.stderr  # the progress bar
    assert f"{len(broken)} line(s) answered with an error" in done.stderr
    check_answers(read_answers(target), source, broken)
    again = run_cli("render", str(source), str(target))
    assert again.returncode != 0 and "--resume" in again.stderr  # never overwrites


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_batch_resumes_after_a_kill_without_duplicates(tmp_path: Path, stop: int) -> None:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    broken = write_requests(source, 2000)
    command = [sys.executable, "-m", "render_service", "batch", "render", str(source), str(target)]
    process = subprocess.Popen(
        [*command, "--workers", "2", "--no-progress"],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if target.exists() and target.stat().st_size > 20_000:
            break
        time.sleep(0.05)
    killed = process.poll() is None
    if killed:
        # The run and its workers (a terminal's Ctrl-C reaches the whole group too).
        os.killpg(process.pid, stop)
    _, stderr = process.communicate(timeout=60)
    if killed and stop == signal.SIGINT:
        assert process.returncode == 130 and "--resume continues" in stderr
    written = target.read_bytes().count(b"\n")
    resumed = run_cli("render", str(source), str(target), "--resume", "--workers", "2")
    assert resumed.returncode == 0, resumed.stderr
    answers = read_answers(target)
    check_answers(answers, source, broken)
    if killed:
        assert written < len(answers)


def test_batch_derender_answers_like_the_library(tmp_path: Path) -> None:
    renderer = Renderer.from_pretrained(str(ensure_default_model()))
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    texts = ["Hello there.", "Two words", ""]
    with source.open("w", encoding="utf-8") as f:
        for text in texts:
            ids = renderer.tokenize({"prompt": text}).tokens
            body = {
                "generate_response": {
                    "request_id": "r",
                    "choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop"}],
                },
                "prompt_token_ids": [1, 2],
            }
            f.write(json.dumps(body) + "\n")
        f.write("\n")
    done = run_cli("derender", str(source), str(target), "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    answers = read_answers(target)
    assert [a["line"] for a in answers] == [1, 2, 3, 4]
    assert answers[0]["result"]["choices"][0]["message"]["content"] == "Hello there."
    assert answers[1]["result"]["choices"][0]["message"]["content"] == "Two words"
    assert "error" in answers[2]  # empty token_ids: the HTTP derender's 400 too
    assert answers[3]["error"]["message"] == "empty line"


@pytest.mark.parametrize("workers", ["-1"])
def test_batch_refuses_a_negative_worker_count(tmp_path: Path, workers: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n", encoding="utf-8")
    done = run_cli("render", str(source), str(tmp_path / "out.jsonl"), "--workers", workers)
    assert done.returncode == 2 and "--workers" in done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_batch_stops_on_a_model_that_does_not_load(tmp_path: Path, workers: str) -> None:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    missing = str(tmp_path / "no model here")
    done = run_cli("render", str(source), str(target), "--model", missing, "--workers", workers)
    assert done.returncode == 1
    assert "cannot load the model" in done.stderr and "no model here" in done.stderr
    assert not target.exists()  # nothing was answered: no empty output to --resume
