"""Qwen2-VL / Qwen2.5-VL image preprocessing on numpy, matching vLLM 0.33's output bit for bit.

vLLM runs transformers' ``Qwen2VLImageProcessor`` (torchvision backend) with rescaling and
normalization left to the model, so what goes on the wire is the *uint8* resized image cut into
patches. The only numeric step is the resize: torchvision hands a uint8 tensor to torch's
antialiased bicubic kernel for uint8 (the Pillow-compatible one), which works in fixed point:
weights rounded to int16 at a per-axis precision, a horizontal pass then a vertical pass, each
rounded and clipped back to uint8. ``resize_bicubic_u8`` reproduces that arithmetic exactly;
Pillow's own BICUBIC differs in a few pixels per image (other weight precision).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeGuard

import msgspec
import numpy as np
from numpy.typing import NDArray

from render_service.errors import InvalidRequest


class VisionConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The processor settings that shape the output (preprocessor_config.json + token ids)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_token_id: int = 151655

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_model_dir(cls, path: str | Path) -> VisionConfig | None:
        """The config of a Qwen2-VL-family model directory, or None for other models."""
        folder = Path(path)
        pre = _read(folder / "preprocessor_config.json")
        if pre.get("image_processor_type") not in (
            "Qwen2VLImageProcessor",
            "Qwen2VLImageProcessorFast",
        ):
            return None
        config = _read(folder / "config.json")
        size = pre.get("size") or {}
        return cls(
            min_pixels=int(pre.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(pre.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            patch_size=int(pre.get("patch_size", 14)),
            temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
            merge_size=int(pre.get("merge_size", 2)),
            image_token_id=int(config.get("image_token_id", 151655)),
        )

    def with_kwargs(self, kwargs: dict[str, Any]) -> VisionConfig:
        """Apply ``mm_processor_kwargs`` the way the HF processor reads them (pixel bounds)."""
        if not kwargs:
            return self
        known = {"min_pixels", "max_pixels", "size"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidRequest(
                f"Unsupported mm_processor_kwargs for this model: {', '.join(unknown)}",
                "mm_processor_kwargs",
            )
        size = kwargs.get("size") or {}
        if not isinstance(size, dict):
            raise InvalidRequest(
                "mm_processor_kwargs.size must be an object", "mm_processor_kwargs"
            )
        low = kwargs.get("min_pixels", size.get("shortest_edge", self.min_pixels))
        high = kwargs.get("max_pixels", size.get("longest_edge", self.max_pixels))
        if not (_positive_int(low) and _positive_int(high)) or low > high:
            raise InvalidRequest(
                "mm_processor_kwargs pixel bounds must be positive integers with min <= max",
                "mm_processor_kwargs",
            )
        return msgspec.structs.replace(self, min_pixels=low, max_pixels=high)


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


class ProcessedImage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One image ready for the engine: patch rows and the (t, h, w) patch grid."""

    pixel_values: NDArray[np.uint8]  # (t*h*w, channels * temporal * patch * patch)
    grid_thw: tuple[int, int, int]
    num_tokens: int  # placeholder tokens: one per merge_size x merge_size block of patches


def smart_resize(height: int, width: int, config: VisionConfig) -> tuple[int, int]:
    """Target (height, width): multiples of the patch factor, pixel count within bounds."""
    if max(height, width) / min(height, width) > 200:
        raise InvalidRequest(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    factor = config.factor
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > config.max_pixels:
        beta = math.sqrt((height * width) / config.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < config.min_pixels:
        beta = math.sqrt(config.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _bicubic(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Keys' cubic with a = -0.5 (the antialiased kernels' choice, as in Pillow)."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _axis_weights(in_size: int, out_size: int) -> tuple[NDArray[np.intp], NDArray[np.int32], int]:
    """Per output pixel: tap indices (out, taps), int16-range weights (out, taps), precision."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    lo = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    hi = np.minimum((centers + support + 0.5).astype(np.int64), in_size)
    taps = int((hi - lo).max())
    offsets = np.arange(taps)
    index = lo[:, None] + offsets[None, :]
    valid = index < hi[:, None]
    weights = _bicubic((index - centers[:, None] + 0.5) * inv) * valid
    totals = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, totals, out=np.zeros_like(weights), where=totals != 0)
    # The largest precision at which the biggest weight still fits in an int16.
    peak = float(weights.max())
    precision = 0
    while precision < 15 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    return np.minimum(index, in_size - 1), fixed, precision


_BLOCK = 32  # output rows per step: the int32 accumulators stay in cache


def _resample(image: NDArray[np.uint8], axis: int, out_size: int) -> NDArray[np.uint8]:
    index, weights, precision = _axis_weights(image.shape[axis], out_size)
    # Resampled axis first and contiguous, so every tap gathers whole uint8 rows.
    moved = np.ascontiguousarray(np.moveaxis(image, axis, 0))
    rows = moved.reshape(moved.shape[0], -1)
    out = np.empty((out_size, rows.shape[1]), dtype=np.uint8)
    acc = np.empty((_BLOCK, rows.shape[1]), dtype=np.int32)
    term = np.empty_like(acc)
    for start in range(0, out_size, _BLOCK):
        stop = min(out_size, start + _BLOCK)
        block, tmp = acc[: stop - start], term[: stop - start]
        block.fill(1 << (precision - 1))
        for tap in range(index.shape[1]):
            np.multiply(rows[index[start:stop, tap]], weights[start:stop, tap, None], out=tmp)
            block += tmp
        block >>= precision
        np.clip(block, 0, 255, out=block)
        out[start:stop] = block
    return np.moveaxis(out.reshape(out_size, *moved.shape[1:]), 0, axis)


def resize_bicubic_u8(image: NDArray[np.uint8], height: int, width: int) -> NDArray[np.uint8]:
    """Antialiased bicubic resize of an (H, W, C) uint8 image, torch's uint8 arithmetic."""
    out = image
    if width != out.shape[1]:
        out = _resample(out, 1, width)
    if height != out.shape[0]:
        out = _resample(out, 0, height)
    return np.ascontiguousarray(out)


def patchify(image: NDArray[np.uint8], config: VisionConfig) -> ProcessedImage:
    """(H, W, C) uint8 -> patch rows in Qwen2-VL's order (merge blocks contiguous)."""
    height, width, channels = image.shape
    p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    blocks = image.reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
    # -> (h/m, w/m, m, m, channels, patch, patch); one still image fills every temporal slot.
    blocks = blocks.transpose(0, 3, 1, 4, 6, 2, 5)
    rows = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p)).reshape(
        grid_h * grid_w, channels * t * p * p
    )
    return ProcessedImage(
        pixel_values=np.ascontiguousarray(rows),
        grid_thw=(1, grid_h, grid_w),
        num_tokens=grid_h * grid_w // (m * m),
    )


def process_image(rgb: NDArray[np.uint8], config: VisionConfig) -> ProcessedImage:
    """An (H, W, 3) uint8 RGB image -> the engine's ``pixel_values`` and ``image_grid_thw``."""
    height, width = rgb.shape[:2]
    target_h, target_w = smart_resize(height, width, config)
    resized = resize_bicubic_u8(rgb, target_h, target_w)
    return patchify(resized, config)
