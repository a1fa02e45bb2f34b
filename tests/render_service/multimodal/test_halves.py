"""Splitting an image's work: every row done exactly once, with or without a free helper."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from render_service.multimodal.halves import Helper, over_halves
from render_service.multimodal.qwen2_vl import VisionConfig, process_image
from render_service.multimodal.resample import resize_bicubic_u8


def covered(helper: Helper | None, size: int) -> list[int]:
    hits = [0] * size
    lock = threading.Lock()

    def step(start: int, stop: int) -> None:
        with lock:
            for i in range(start, stop):
                hits[i] += 1

    over_halves(helper, step, size)
    return hits


@pytest.mark.parametrize("size", [0, 1, 2, 7, 100])
def test_every_index_once(size: int) -> None:
    assert covered(None, size) == [1] * size
    assert covered(Helper(), size) == [1] * size


def test_a_busy_helper_is_not_waited_for() -> None:
    helper = Helper()
    started, release = threading.Event(), threading.Event()

    def slow(start: int, stop: int) -> None:
        if start > 0:
            started.set()
            release.wait(10)

    busy = threading.Thread(target=over_halves, args=(helper, slow, 10))
    busy.start()
    assert started.wait(10)
    # The helper is stuck in the other image's half: this step runs whole, right here.
    assert covered(helper, 5) == [1] * 5
    release.set()
    busy.join(10)


def test_errors_surface_after_both_halves_finish() -> None:
    finished = threading.Event()

    def step(start: int, stop: int) -> None:
        if start == 0:
            raise ValueError("first half failed")
        finished.set()

    with pytest.raises(ValueError, match="first half failed"):
        over_halves(Helper(), step, 4)
    assert finished.is_set()


def test_split_images_are_bit_identical() -> None:
    image = np.random.default_rng(5).integers(0, 256, (301, 457, 3), dtype=np.uint8)
    helper = Helper()
    assert np.array_equal(
        resize_bicubic_u8(image, 150, 700, helper), resize_bicubic_u8(image, 150, 700)
    )
    config = VisionConfig()
    split = process_image(image, config, helper=helper).pixel_values
    assert np.array_equal(split, process_image(image, config).pixel_values)
