"""The batch run: stream IN.jsonl through worker processes into OUT.jsonl, in input order.

Memory stays constant: lines are read as they are sent, and at most ``2 * workers`` chunks are
in flight. The run process only reads, hands chunks to the workers and writes their answers; the
workers, forked around the model the run loaded once, do the rendering. OUT gets one line per input line, in order, so a run that was interrupted resumes
(``resume=True``) after the last complete output line without writing any line twice.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import IO

import msgspec
from tqdm import tqdm

from render_service.batch.lines import Mode, answer_line, encode_answers
from render_service.errors import RenderServiceError
from render_service.library import Renderer
from render_service.model.loading import Model
from render_service.settings import Settings

CHUNK_LINES = 64
_FORK = "fork" in multiprocessing.get_all_start_methods()


class BatchOptions(msgspec.Struct, frozen=True, kw_only=True):
    mode: Mode
    source: str
    target: str
    workers: int = 0  # 0: every core
    resume: bool = False
    progress: bool = True


class BatchError(Exception):
    """The run cannot start or go on (the output exists without --resume or is not ours to
    resume, or the model does not load)."""


# This process's renderer: the run's own with one worker, else each worker process's.
_renderer: Renderer | None = None
# The model the run loaded before forking its workers (None where processes are spawned).
_model: Model | None = None
# Why this worker has no renderer: every chunk it gets says so, and the run stops with it.
_load_error: str | None = None


class _ModelOnly(Renderer):
    """What ``Renderer.from_settings`` loads, the model, without the renderer around it."""

    def __init__(self, model: Model, settings: Settings) -> None:
        # No renderer yet: its encoder threads would not survive the fork to the workers.
        self.model = model


def _load(settings: Settings) -> Model:
    """The model, loaded once by the run: forked workers share it instead of each loading it
    again (a 2-worker run used to load it three times: about 9 CPU-seconds instead of 3)."""
    try:
        return _ModelOnly.from_settings(settings).model
    except (RenderServiceError, OSError, ValueError) as exc:
        raise BatchError(f"cannot load the model: {exc}") from exc


def _init_worker(settings: Settings) -> None:
    # The renderer is built here, in the worker, around the model inherited from the run.
    global _renderer, _load_error
    # Ctrl-C reaches the whole process group: the run alone stops, after the chunks in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _renderer = (
            Renderer.from_settings(settings) if _model is None else Renderer(_model, settings)
        )
    except Exception as exc:  # reported by the first chunk, as the run's error
        _load_error = f"cannot set up the renderer: {exc}"


def _work(mode: Mode, first: int, lines: list[bytes]) -> tuple[bytes, int]:
    """A chunk's output lines and how many of them are errors."""
    if _renderer is None:
        raise BatchError(_load_error or "batch worker has no renderer")
    answers = [answer_line(_renderer, mode, first + i, line) for i, line in enumerate(lines)]
    return encode_answers(answers), sum(a.error is not None for a in answers)


def _done_lines(target: Path) -> int:
    """Complete lines already in ``target``; a partial last line (an interrupted write) is cut."""
    if not target.exists():
        return 0
    count = 0
    end = 0
    with target.open("rb") as f:
        position = 0
        for line in f:
            position += len(line)
            if line.endswith(b"\n"):
                count += 1
                end = position
    if end != target.stat().st_size:
        os.truncate(target, end)
    return count


def _count_lines(source: Path) -> int:
    count = 0
    last = b"\n"
    with source.open("rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _chunks(f: IO[bytes], skip: int) -> Iterator[tuple[int, list[bytes]]]:
    """(number of the first line, lines) for every chunk after the first ``skip`` lines."""
    number = 0
    chunk: list[bytes] = []
    first = skip + 1
    for line in f:
        number += 1
        if number <= skip:
            continue
        chunk.append(line.rstrip(b"\r\n"))
        if len(chunk) == CHUNK_LINES:
            yield first, chunk
            first += len(chunk)
            chunk = []
    if chunk:
        yield first, chunk


def _progress(total: int, initial: int, enabled: bool) -> tqdm[None]:
    return tqdm(
        total=total,
        initial=initial,
        unit=" lines",
        dynamic_ncols=True,
        disable=not enabled,
        file=sys.stderr,
        smoothing=0.1,
    )


def run_batch(settings: Settings, options: BatchOptions) -> int:
    """Run the batch; the number of lines answered with an error."""
    source, target = Path(options.source), Path(options.target)
    if not options.resume and target.exists() and target.stat().st_size:
        raise BatchError(f"{target} exists: pass --resume to continue it, or remove it")
    done = _done_lines(target) if options.resume else 0
    total = _count_lines(source)
    if done > total:
        raise BatchError(f"{target} has {done} lines, more than {source} ({total}): not its output")
    workers = options.workers or _cores()
    global _renderer, _model
    if workers == 1:
        _renderer = Renderer(_load(settings), settings)
    elif _FORK:
        _model = _load(settings)
    bar = _progress(total, done, options.progress)
    errors = 0
    existed = target.exists()
    try:
        with source.open("rb") as f, target.open("ab") as out:
            results = _results(options.mode, settings, workers, _chunks(f, done))
            for answered, failed in results:
                out.write(answered)
                out.flush()
                errors += failed
                bar.update(answered.count(b"\n"))
    except BatchError:
        if not existed and not target.stat().st_size:
            target.unlink()  # the run never started: leave no empty output behind
        raise
    finally:
        bar.close()
        if _renderer is not None:
            _renderer.close()
        _renderer = _model = None
    return errors


def _cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _results(
    mode: Mode, settings: Settings, workers: int, chunks: Iterator[tuple[int, list[bytes]]]
) -> Iterator[tuple[bytes, int]]:
    """The answered chunks, in input order, computed by ``workers`` processes."""
    if workers == 1:
        for first, lines in chunks:
            yield _work(mode, first, lines)
        return
    context = multiprocessing.get_context("fork" if _FORK else "spawn")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(settings,)
    ) as pool:
        pending: deque[Future[tuple[bytes, int]]] = deque()
        for first, lines in chunks:
            pending.append(pool.submit(_work, mode, first, lines))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
