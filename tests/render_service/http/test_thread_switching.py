"""The GIL hand-over interval: shortened in image servers only."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from render_service.http.server import IMAGE_SWITCH_INTERVAL, tune_thread_switching


@pytest.fixture
def restore_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_image_servers_hand_the_gil_over_sooner(restore_interval: float) -> None:
    tune_thread_switching(serves_images=True)
    assert sys.getswitchinterval() == pytest.approx(IMAGE_SWITCH_INTERVAL)
    assert restore_interval > IMAGE_SWITCH_INTERVAL  # shorter than the default


def test_text_servers_keep_pythons_default(restore_interval: float) -> None:
    tune_thread_switching(serves_images=False)
    assert sys.getswitchinterval() == restore_interval
