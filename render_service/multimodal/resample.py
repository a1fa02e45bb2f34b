"""torch's antialiased bicubic resize of uint8 images, bit for bit, compiled with numba.

torch works in fixed point: per axis, Keys' cubic (a = -0.5) weights normalised, rounded to
int16 at the largest precision the biggest weight allows; a horizontal pass then a vertical
pass, each accumulating in int32 from a rounding bias, shifted back and clipped to uint8.

The horizontal pass writes one plane per channel; the vertical pass writes its rows straight
into a vision model's patch layout (patches of one pixel give the plain resized image), so no
resized image is ever copied into patches. Both inner loops run over contiguous bytes, which
LLVM vectorises: the horizontal pass over a band of rows transposed into a small buffer, the
vertical pass over whole plane rows. Indices are unsigned, so numba adds no negative-index
checks that would stop the copies from vectorising.

The kernels compile on first use (under a second); ``warm_up`` does that ahead of requests. No
on-disk cache: it needs a writable directory, which read-only containers do not have.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from numba import njit
from numpy.typing import NDArray

from render_service.multimodal.halves import Helper, over_halves

_BAND = 16  # image rows per step of the horizontal pass
# How often a caller that streams the rows hears of them. Each step is a hand-off to the helper
# and a piece to send: measured here under load (4 clients, 4-image requests), 8 steps cost 6%
# of throughput against none and 4 steps 2% against 2, which lost nothing; a lone request was
# about as fast with 2 as with 8.
_PROGRESS_STEPS = 2
_u64 = np.uint64  # the kernels' index type (see the module docstring)


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
    if in_size == out_size:
        # torch's weights between equal sizes put all the weight on one tap: the identity.
        # One tap of weight 2 at precision 1 is that identity, at a quarter of the work.
        index = np.arange(in_size, dtype=np.intp)[:, None]
        fixed = np.full((in_size, 1), 2, np.int32)
        index.flags.writeable = fixed.flags.writeable = False
        return index, fixed, 1
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


@njit(nogil=True, boundscheck=False)
def _resample_columns(
    src: NDArray[np.uint8],
    index: NDArray[np.intp],
    weights: NDArray[np.int32],
    precision: int,
    planes: NDArray[np.uint8],
    start: int,
    stop: int,
) -> None:
    """Rows [start, stop) of an (H, W, 3 or 4) image resampled along the width into (3, H, W')
    planes (a fourth channel is padding, skipped).

    Each band of rows is transposed into a small buffer (one line per input column), so the
    inner loop runs over contiguous bytes; the buffer stays in cache.
    """
    in_width = _u64(src.shape[1])
    stride = _u64(src.shape[2])
    out_width = _u64(planes.shape[2])
    plane_size = _u64(planes.shape[1]) * out_width
    lanes_max = _u64(_BAND * 3)
    pixels = src.reshape(-1)
    out = planes.reshape(-1)
    taps = _u64(index.shape[1])
    band = np.empty(in_width * lanes_max, np.uint8)
    acc = np.empty(lanes_max, np.int32)
    bias = np.int32(1 << (precision - 1))
    for y0 in range(_u64(start), _u64(stop), _u64(_BAND)):
        rows = min(_u64(_BAND), _u64(stop) - y0)
        lanes = rows * _u64(3)
        for y in range(rows):
            line = (y0 + y) * in_width * stride
            for x in range(in_width):
                at = line + x * stride
                to = x * lanes_max + y * _u64(3)
                band[to] = pixels[at]
                band[to + _u64(1)] = pixels[at + _u64(1)]
                band[to + _u64(2)] = pixels[at + _u64(2)]
        for x in range(out_width):
            acc[:] = bias
            for t in range(taps):
                w = weights[x, t]
                line = _u64(index[x, t]) * lanes_max
                for i in range(lanes):
                    acc[i] += w * np.int32(band[line + i])
            for y in range(rows):
                for c in range(_u64(3)):
                    value = min(max(acc[y * _u64(3) + c] >> precision, 0), 255)
                    out[c * plane_size + (y0 + y) * out_width + x] = value


@njit(nogil=True, boundscheck=False)
def _resample_rows_into_patches(
    planes: NDArray[np.uint8],
    index: NDArray[np.intp],
    weights: NDArray[np.int32],
    precision: int,
    patch: int,
    merge: int,
    temporal: int,
    out: NDArray[np.uint8],
    start: int,
    stop: int,
) -> None:
    """Bands [start, stop) of ``patch`` output rows, resampled along the height, as patch rows.

    A patch row holds, per channel, the ``patch`` x ``patch`` pixels once per temporal slot;
    rows go by ``merge`` x ``merge`` blocks of patches, left to right, then top to bottom.
    A band is gathered in patch order in a small buffer, then copied out a patch at a time.
    """
    channels = _u64(planes.shape[0])
    width = _u64(planes.shape[2])
    plane_size = _u64(planes.shape[1]) * width
    pixels = planes.reshape(-1)
    rows = out.reshape(-1)
    row_width = _u64(out.shape[1])
    p, m, slots = _u64(patch), _u64(merge), _u64(temporal)
    area = p * p
    columns = width // p
    blocks_wide = columns // m
    taps = _u64(index.shape[1])
    acc = np.empty(width, np.int32)
    band = np.empty(channels * columns * area, np.uint8)  # (channel, column, y, x)
    bias = np.int32(1 << (precision - 1))
    for b in range(_u64(start), _u64(stop)):
        for dy in range(p):
            y = b * p + dy
            for c in range(channels):
                acc[:] = bias
                for t in range(taps):
                    w = weights[y, t]
                    line = c * plane_size + _u64(index[y, t]) * width
                    for i in range(width):
                        acc[i] += w * np.int32(pixels[line + i])
                for j in range(columns):
                    to = (c * columns + j) * area + dy * p
                    for k in range(p):
                        band[to + k] = min(max(acc[j * p + k] >> precision, 0), 255)
        block_y, inner_y = b // m, b % m
        for j in range(columns):
            row = ((block_y * blocks_wide + j // m) * m + inner_y) * m + j % m
            for c in range(channels):
                at = (c * columns + j) * area
                for s in range(slots):
                    to = row * row_width + (c * slots + s) * area
                    for k in range(area):
                        rows[to + k] = band[at + k]


def resize_into_patches(
    image: NDArray[np.uint8],
    height: int,
    width: int,
    patch: int,
    merge: int,
    temporal: int,
    out: NDArray[np.uint8],
    helper: Helper | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Resize an (H, W, 3) uint8 image with torch's arithmetic, writing patch rows into ``out``.

    An (H, W, 4) image is read as RGB plus padding (``decode.decode_rgb``'s JPEG layout).
    ``out`` is (height * width / patch**2, 3 * temporal * patch**2); height and width are
    multiples of ``patch * merge``. With a free ``helper``, each pass is split in two.
    ``progress`` is called a few times with how many leading rows of ``out`` are final, the
    last time with all of them.
    """
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(f"expected an (H, W, 3) or (H, W, 4) image, got shape {image.shape}")
    if height % (patch * merge) or width % (patch * merge):
        raise ValueError(f"{height}x{width} is not made of {patch * merge}-pixel blocks")
    if out.shape != (height * width // patch**2, 3 * temporal * patch**2):
        raise ValueError(f"patch rows of shape {out.shape} do not fit {height}x{width}")
    src = np.ascontiguousarray(image)
    columns = axis_weights(src.shape[1], width)
    planes = np.empty((3, src.shape[0], width), np.uint8)
    over_halves(helper, lambda a, b: _resample_columns(src, *columns, planes, a, b), src.shape[0])
    rows = axis_weights(src.shape[0], height)
    bands = height // patch  # every ``merge`` bands finish a row of merge blocks: whole rows
    step = bands if progress is None else merge * -(-bands // (merge * _PROGRESS_STEPS))

    def bands_from(first: int) -> Callable[[int, int], None]:
        return lambda a, b: _resample_rows_into_patches(
            planes, *rows, patch, merge, temporal, out, first + a, first + b
        )

    for first in range(0, bands, step):
        last = min(bands, first + step)
        over_halves(helper, bands_from(first), last - first)
        if progress is not None:
            progress(last * (width // patch))


def resize_bicubic_u8(
    image: NDArray[np.uint8], height: int, width: int, helper: Helper | None = None
) -> NDArray[np.uint8]:
    """Antialiased bicubic resize of an (H, W, 3 or 4) uint8 image, torch's uint8 arithmetic."""
    out = np.empty((height * width, 3), np.uint8)  # patches of one pixel: the image itself
    resize_into_patches(image, height, width, 1, 1, 1, out, helper)
    return out.reshape(height, width, 3)


def warm_up() -> None:
    """Compile the kernels now, so no request waits for the compiler.

    numba compiles once per argument type, and read-only arrays (what ``np.asarray`` makes of
    a Pillow image) are a type of their own, so both kinds are run.
    """
    image = np.zeros((2, 2, 3), np.uint8)
    resize_bicubic_u8(image, 3, 3)
    image.flags.writeable = False
    resize_bicubic_u8(image, 3, 3)
