"""A worker takes what it loaded out of the garbage collector's generations, not later garbage,
and collects its young generation less often."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from render_service.http.server import GC_YOUNG_THRESHOLD, tune_garbage_collection


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfreeze() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_loaded_objects_are_frozen_and_later_cycles_still_collected(unfreeze: None) -> None:
    loaded = [{"kept": i} for i in range(100)]
    tune_garbage_collection()
    assert gc.get_freeze_count() >= len(loaded)
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_garbage_is_collected_before_the_freeze(unfreeze: None) -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    tune_garbage_collection()
    gc.collect()
    assert gone() is None  # collected before the freeze, so not kept forever
