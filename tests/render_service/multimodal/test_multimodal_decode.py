"""decode_rgb: JPEGs decoded straight into an RGBX array give Pillow's own pixels and errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from render_service.multimodal.decode import decode_rgb, open_lazily
from tests.media_support import image_bytes, truncated_jpeg

WHITE = (255, 255, 255)
LIMIT = 10**9


def photo(width: int, height: int, seed: int) -> Image.Image:
    """Smooth colour gradients with noise: what JPEG is made for (and mostly sees)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([127 + 100 * np.sin(x / (7 + 5 * c) + y / (9 + 3 * c)) for c in range(3)], -1)
    noisy = base + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", **options)
    return out.getvalue()


def pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def decoded(data: bytes) -> np.ndarray:
    return decode_rgb(open_lazily(data, LIMIT), data, WHITE)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 70),
    st.integers(1, 70),
    st.sampled_from([0, 1, 2]),  # 4:4:4, 4:2:2, 4:2:0
    st.integers(5, 100),
    st.booleans(),
    st.booleans(),
)
def test_rgb_jpeg_pixels_are_pillows(
    width: int, height: int, subsampling: int, quality: int, progressive: bool, optimize: bool
) -> None:
    data = jpeg(
        photo(width, height, width * 71 + height),
        subsampling=subsampling,
        quality=quality,
        progressive=progressive,
        optimize=optimize,
    )
    pixels = decoded(data)
    assert pixels.shape == (height, width, 4)
    assert np.array_equal(pixels[..., :3], pillow_rgb(data))


def test_a_720p_photo_with_restart_markers_and_exif() -> None:
    image = photo(1280, 720, 3)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: neither vLLM nor Pillow's plain decode applies it
    data = jpeg(image, quality=88, restart_marker_rows=2, exif=exif.tobytes())
    assert np.array_equal(decoded(data)[..., :3], pillow_rgb(data))


@pytest.mark.parametrize(("fmt", "mode"), [("JPEG", "L"), ("PNG", "RGB"), ("PNG", "RGBA")])
def test_other_images_go_through_pillow(fmt: str, mode: str) -> None:
    data = image_bytes(40, 30, fmt, seed=5, mode=mode)
    pixels = decoded(data)
    assert pixels.shape == (30, 40, 3)
    if mode != "RGBA":  # RGBA is composited over the background, tested elsewhere
        assert np.array_equal(pixels, pillow_rgb(data))


def test_cmyk_jpeg_goes_through_pillow() -> None:
    data = jpeg(photo(24, 16, 1).convert("CMYK"))
    assert np.array_equal(decoded(data), pillow_rgb(data))


def test_truncated_jpeg_is_refused() -> None:
    with pytest.raises(ValueError, match="JPEG image is truncated or corrupt"):
        decoded(truncated_jpeg())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 8))
def test_damaged_jpeg_fails_or_decodes_as_pillow_does(seed: int, flips: int) -> None:
    data = bytearray(jpeg(photo(48, 32, 9), quality=80))
    rng = np.random.default_rng(seed)
    for at in rng.integers(len(data) // 4, len(data), flips):  # past the headers, mostly
        data[at] = int(rng.integers(0, 256))
    damaged = bytes(data)
    try:
        expected = pillow_rgb(damaged)
    except (OSError, SyntaxError, ValueError):
        expected = None
    try:
        got = decoded(damaged)[..., :3]
    except ValueError:
        got = None
    if expected is None:
        assert got is None
    else:
        assert got is not None and np.array_equal(got, expected)
