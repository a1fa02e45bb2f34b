"""torch's antialiased bicubic resize of uint8 images, bit for bit, compiled with numba.

torch works in fixed point: per axis, Keys' cubic (a = -0.5) weights normalised, rounded to
int16 at the largest precision the biggest weight allows; a horizontal pass then a vertical
pass, each accumulating in int32 from a rounding bias, shifted back and clipped to uint8.

Both passes are written so that the innermost loop runs over contiguous bytes (which LLVM
vectorises): the vertical pass over whole rows, the horizontal pass over a transposed band of
rows.

The kernels compile on first use (under a second); ``warm_up`` does that ahead of requests. No
on-disk cache: it needs a writable directory, which read-only containers do not have.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numpy.typing import NDArray

from render_service.multimodal.halves import Helper, over_halves

_BAND = 16  # image rows per step of the horizontal pass


def _cubic(x: NDArray[np.float64]) -> NDArray[np.float64]:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=256)  # a millisecond each; images come in a few common sizes
def axis_weights(in_size: int, out_size: int) -> tuple[NDArray[np.intp], NDArray[np.int32], int]:
    """Per output pixel: tap indices (out, taps), int16-range weights (out, taps), precision.

    Cached, so the arrays are shared: read them, never write them.
    """
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    lo = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    hi = np.minimum((centers + support + 0.5).astype(np.int64), in_size)
    taps = int((hi - lo).max())
    index = lo[:, None] + np.arange(taps)[None, :]
    valid = index < hi[:, None]
    weights = _cubic((index - centers[:, None] + 0.5) * inv) * valid
    totals = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, totals, out=np.zeros_like(weights), where=totals != 0)
    peak = float(weights.max())
    precision = 0
    while precision < 15 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    # Invalid taps have weight 0; pointing them at a real row keeps the kernel branch-free.
    taps_at = np.minimum(index, in_size - 1).astype(np.intp)
    taps_at.flags.writeable = fixed.flags.writeable = False
    return taps_at, fixed, precision


@njit(nogil=True)
def _resample_rows(
    src: NDArray[np.uint8],
    index: NDArray[np.intp],
    weights: NDArray[np.int32],
    precision: int,
    out: NDArray[np.uint8],
) -> None:
    """out[y] = clip((bias + sum_t weights[y, t] * src[index[y, t]]) >> precision), per row."""
    width = src.shape[1]
    acc = np.empty(width, np.int32)
    bias = np.int32(1 << (precision - 1))
    for y in range(out.shape[0]):
        acc[:] = bias
        for t in range(index.shape[1]):
            w = weights[y, t]
            row = src[index[y, t]]
            for i in range(width):
                acc[i] += w * np.int32(row[i])
        for i in range(width):
            out[y, i] = min(max(acc[i] >> precision, 0), 255)


@njit(nogil=True)
def _resample_columns(
    src: NDArray[np.uint8],
    index: NDArray[np.intp],
    weights: NDArray[np.int32],
    precision: int,
    out: NDArray[np.uint8],
) -> None:
    """The same sum along the width of an (H, W, 3) image, a band of rows at a time.

    Each band is transposed into a small buffer (one line per input column), so the inner
    loop again runs over contiguous bytes; the buffer stays in cache.
    """
    height, in_width = src.shape[:2]
    band = np.empty((in_width, _BAND * 3), np.uint8)
    acc = np.empty(_BAND * 3, np.int32)
    bias = np.int32(1 << (precision - 1))
    for y0 in range(0, height, _BAND):
        rows = min(_BAND, height - y0)
        for y in range(rows):
            for x in range(in_width):
                band[x, 3 * y] = src[y0 + y, x, 0]
                band[x, 3 * y + 1] = src[y0 + y, x, 1]
                band[x, 3 * y + 2] = src[y0 + y, x, 2]
        for x in range(out.shape[1]):
            acc[:] = bias
            for t in range(index.shape[1]):
                w = weights[x, t]
                line = band[index[x, t]]
                for i in range(rows * 3):
                    acc[i] += w * np.int32(line[i])
            for y in range(rows):
                for c in range(3):
                    out[y0 + y, x, c] = min(max(acc[3 * y + c] >> precision, 0), 255)


def resize_bicubic_u8(
    image: NDArray[np.uint8], height: int, width: int, helper: Helper | None = None
) -> NDArray[np.uint8]:
    """Antialiased bicubic resize of an (H, W, 3) uint8 image, torch's uint8 arithmetic.

    With a free ``helper``, each pass is split in two bands of rows, one running there.
    """
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) image, got shape {image.shape}")
    out = np.ascontiguousarray(image)
    if width != out.shape[1]:
        index, weights, precision = axis_weights(out.shape[1], width)
        src, wide = out, np.empty((out.shape[0], width, 3), np.uint8)
        over_halves(
            helper,
            lambda a, b: _resample_columns(src[a:b], index, weights, precision, wide[a:b]),
            src.shape[0],
        )
        out = wide
    if height != out.shape[0]:
        index, weights, precision = axis_weights(out.shape[0], height)
        rows, tall = out.reshape(out.shape[0], -1), np.empty((height, out.shape[1] * 3), np.uint8)
        over_halves(
            helper,
            lambda a, b: _resample_rows(rows, index[a:b], weights[a:b], precision, tall[a:b]),
            height,
        )
        out = tall.reshape(height, -1, 3)
    return out


def warm_up() -> None:
    """Compile the kernels now (both passes run), so no request waits for the compiler.

    numba compiles once per argument type, and read-only arrays (what ``np.asarray`` makes of
    a Pillow image) are a type of their own, so both kinds are run.
    """
    image = np.zeros((2, 2, 3), np.uint8)
    resize_bicubic_u8(image, 3, 3)
    image.flags.writeable = False
    resize_bicubic_u8(image, 3, 3)
