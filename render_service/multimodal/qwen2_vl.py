"""Qwen2-VL / Qwen2.5-VL image preprocessing on numpy, matching vLLM 0.33's output bit for bit.

vLLM runs transformers' ``Qwen2VLImageProcessor`` (torchvision backend) with rescaling and
normalization left to the model, so what goes on the wire is the *uint8* resized image cut into
patches. The only numeric step is the resize: torchvision hands a uint8 tensor to torch's
antialiased bicubic kernel for uint8, which ``resample`` reproduces exactly, writing the
patches as it goes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import msgspec
import numpy as np
from numpy.typing import NDArray

from render_service.errors import InvalidRequest
from render_service.model.loading import read_json
from render_service.multimodal import IMAGE_PROCESSORS
from render_service.multimodal.halves import Helper


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
        pre = read_json(folder / "preprocessor_config.json")
        if pre.get("image_processor_type") not in IMAGE_PROCESSORS:
            return None
        config = read_json(folder / "config.json")
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


def patch_grid(height: int, width: int, config: VisionConfig) -> tuple[int, int, int]:
    """The (t, h, w) patch grid of an image of this size, once resized."""
    resized_h, resized_w = smart_resize(height, width, config)
    return 1, resized_h // config.patch_size, resized_w // config.patch_size


def patch_row_width(config: VisionConfig, channels: int = 3) -> int:
    """Bytes per patch row: every channel's patch, repeated over the temporal slots."""
    return channels * config.temporal_patch_size * config.patch_size**2


def process_image(
    rgb: NDArray[np.uint8],
    config: VisionConfig,
    out: NDArray[np.uint8] | None = None,
    helper: Helper | None = None,
    progress: Callable[[int], None] | None = None,
) -> ProcessedImage:
    """An (H, W, 3) uint8 RGB image (or (H, W, 4), padded) -> the engine's ``pixel_values``
    and ``image_grid_thw``.

    ``out``, when given, receives the patch rows (a view into the serialized item, say);
    ``helper`` takes half of the work when it is free; ``progress`` hears how many leading
    rows are final (``resize_into_patches``).
    """
    # Imported here: numba costs text-only servers 0.6 s of start-up and 40 MB if loaded.
    from render_service.multimodal.resample import resize_into_patches

    height, width = smart_resize(rgb.shape[0], rgb.shape[1], config)
    p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    if out is None:
        out = np.empty((grid_h * grid_w, patch_row_width(config)), np.uint8)
    # Patch rows in Qwen2-VL's order: merge blocks contiguous, one still image in every
    # temporal slot.
    resize_into_patches(rgb, height, width, p, m, t, out, helper, progress)
    return ProcessedImage(
        pixel_values=out,
        grid_thw=(1, grid_h, grid_w),
        num_tokens=grid_h * grid_w // (m * m),
    )
