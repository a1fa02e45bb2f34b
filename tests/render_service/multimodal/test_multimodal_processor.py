"""The numpy Qwen2-VL processor, the hasher's framing and the msgpack layout, without ../shared.

Bit-exactness against vLLM is pinned by the golden tests; here the oracles are independent:
Pillow's own antialiased bicubic resize (the arithmetic torch's uint8 kernel mirrors, with a
different weight precision, so within 2 levels), and the patch geometry read back from pixels.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from render_service.multimodal import serialize
from render_service.multimodal.hashing import EncodedImage, hash_kwargs, image_hash
from render_service.multimodal.qwen2_vl import VisionConfig, process_image, smart_resize
from render_service.multimodal.resample import resize_bicubic_u8, resize_into_patches
from tests.media_support import image_bytes

CONFIG = VisionConfig()


@pytest.mark.parametrize(
    ("height", "width", "out_h", "out_w"),
    [
        (8, 8, 56, 56),
        (30, 60, 56, 84),
        (720, 1280, 728, 1288),
        (1000, 700, 300, 200),
        (37, 911, 56, 1200),
    ],
)
def test_resize_is_pillow_bicubic_within_rounding(
    height: int, width: int, out_h: int, out_w: int
) -> None:
    rng = np.random.default_rng(height * 31 + width)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    ours = resize_bicubic_u8(image, out_h, out_w).astype(int)
    pillow = np.asarray(Image.fromarray(image).resize((out_w, out_h), Image.BICUBIC)).astype(int)
    diff = np.abs(ours - pillow)
    assert ours.shape == pillow.shape
    assert diff.max() <= 2
    assert (diff > 0).mean() < 0.02


def _reference_pass(image: np.ndarray, out_size: int) -> np.ndarray:
    """One axis (the first) of torch's uint8 antialiased bicubic, written out pixel by pixel."""
    in_size = image.shape[0]
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1 else 2.0
    inv = 1.0 / scale if scale >= 1 else 1.0

    def cubic(x: float) -> float:
        x = abs(x)
        if x < 1:
            return (1.5 * x - 2.5) * x * x + 1
        if x < 2:
            return (((x - 5) * x + 8) * x - 4) * -0.5
        return 0.0

    taps = []
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        w = [cubic((j - center + 0.5) * inv) for j in range(lo, hi)]
        total = sum(w)
        taps.append((lo, [v / total for v in w]))
    peak = max(max(w) for _, w in taps)
    precision = 0
    while precision < 15 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    out = np.empty((out_size, *image.shape[1:]), np.uint8)
    for i, (lo, w) in enumerate(taps):
        acc = np.full(image.shape[1:], 1 << (precision - 1), np.int64)
        for k, v in enumerate(w):
            scaled = v * (1 << precision)
            q = int(scaled - 0.5) if scaled < 0 else int(scaled + 0.5)
            acc += image[lo + k].astype(np.int64) * q
        out[i] = np.clip(acc >> precision, 0, 255)
    return out


@pytest.mark.parametrize(
    ("height", "width", "out_h", "out_w"),
    [(8, 8, 56, 56), (30, 60, 56, 84), (100, 70, 30, 20), (37, 311, 56, 120), (64, 48, 64, 100)],
)
def test_resize_equals_a_pixel_by_pixel_reference(
    height: int, width: int, out_h: int, out_w: int
) -> None:
    image = np.random.default_rng(height + width).integers(0, 256, (height, width, 3), np.uint8)
    horizontal = (
        _reference_pass(image.transpose(1, 0, 2), out_w).transpose(1, 0, 2)
        if out_w != width
        else image
    )
    expected = _reference_pass(horizontal, out_h) if out_h != height else horizontal
    assert np.array_equal(resize_bicubic_u8(image, out_h, out_w), expected)


def test_resize_to_the_same_size_is_the_identity() -> None:
    image = np.random.default_rng(1).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    assert np.array_equal(resize_bicubic_u8(image, 56, 84), image)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000))
def test_smart_resize_bounds(height: int, width: int) -> None:
    if max(height, width) / min(height, width) > 200:
        return
    h, w = smart_resize(height, width, CONFIG)
    assert h % 28 == 0 and w % 28 == 0 and h >= 28 and w >= 28
    assert h * w <= CONFIG.max_pixels
    if h > 28 and w > 28:
        assert h * w >= CONFIG.min_pixels


def _patch_by_patch(
    image: np.ndarray, patch: int = 14, merge: int = 2, temporal: int = 2
) -> np.ndarray:
    """Qwen2-VL's patch rows read off an image one patch at a time."""
    rows = []
    block = patch * merge
    for block_y in range(image.shape[0] // block):
        for block_x in range(image.shape[1] // block):
            for dy in range(merge):
                for dx in range(merge):
                    y, x = (block_y * merge + dy) * patch, (block_x * merge + dx) * patch
                    cut = image[y : y + patch, x : x + patch].transpose(2, 0, 1)  # (C, p, p)
                    rows.append(np.stack([cut] * temporal, axis=1).reshape(-1))  # every slot
    return np.stack(rows)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 90),
    st.integers(1, 90),
    st.sampled_from([1, 2, 3, 7]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2]),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_resize_into_patches_is_the_resize_cut_into_patches(
    in_h: int, in_w: int, patch: int, merge: int, temporal: int, blocks_h: int, blocks_w: int
) -> None:
    image = np.random.default_rng(in_h * 97 + in_w).integers(0, 256, (in_h, in_w, 3), np.uint8)
    height, width = blocks_h * patch * merge, blocks_w * patch * merge
    out = np.empty((height * width // patch**2, 3 * temporal * patch**2), np.uint8)
    resize_into_patches(image, height, width, patch, merge, temporal, out)
    resized = resize_bicubic_u8(image, height, width)
    assert np.array_equal(out, _patch_by_patch(resized, patch, merge, temporal))


def test_a_fourth_channel_is_padding() -> None:
    rgbx = np.random.default_rng(8).integers(0, 256, (50, 70, 4), np.uint8)
    rgb = np.ascontiguousarray(rgbx[..., :3])
    assert np.array_equal(resize_bicubic_u8(rgbx, 56, 84), resize_bicubic_u8(rgb, 56, 84))


@pytest.mark.parametrize(("blocks_h", "blocks_w"), [(1, 3), (5, 2), (26, 46)])
def test_progress_reports_rows_that_are_final(blocks_h: int, blocks_w: int) -> None:
    image = np.random.default_rng(blocks_h).integers(0, 256, (50, 60, 4), np.uint8)
    height, width = blocks_h * 28, blocks_w * 28
    out = np.empty((height * width // 196, 1176), np.uint8)
    seen: list[tuple[int, np.ndarray]] = []
    resize_into_patches(
        image, height, width, 14, 2, 2, out, progress=lambda n: seen.append((n, out[:n].copy()))
    )
    counts = [n for n, _ in seen]
    assert counts == sorted(set(counts)) and counts[-1] == len(out)
    assert len(counts) <= 8
    for n, rows in seen:
        assert np.array_equal(rows, out[:n])  # never written again after being reported


def test_resize_into_patches_refuses_what_does_not_fit() -> None:
    image = np.zeros((30, 30, 3), np.uint8)
    with pytest.raises(ValueError, match="blocks"):
        resize_into_patches(image, 30, 56, 14, 2, 2, np.empty((8, 1176), np.uint8))
    with pytest.raises(ValueError, match="do not fit"):
        resize_into_patches(image, 56, 56, 14, 2, 2, np.empty((15, 1176), np.uint8))
    with pytest.raises(ValueError, match="expected"):
        resize_into_patches(image[:, :, :2], 56, 56, 14, 2, 2, np.empty((16, 1176), np.uint8))


@pytest.mark.parametrize(("height", "width"), [(56, 84), (56, 56), (112, 56)])
def test_patch_rows_are_image_patches_in_merge_order(height: int, width: int) -> None:
    # An image already at its target size is not resampled, so its patches are its pixels.
    image = np.random.default_rng(2).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = process_image(image, CONFIG)
    assert out.grid_thw == (1, height // 14, width // 14)
    assert out.num_tokens == height * width // 28**2
    assert np.array_equal(out.pixel_values, _patch_by_patch(image))


def test_patch_rows_of_a_resized_image_are_its_patches() -> None:
    image = np.random.default_rng(4).integers(0, 256, (100, 130, 3), dtype=np.uint8)
    height, width = smart_resize(100, 130, CONFIG)
    resized = resize_bicubic_u8(image, height, width)
    assert np.array_equal(process_image(image, CONFIG).pixel_values, _patch_by_patch(resized))


def test_process_image_upscales_tiny_images_to_min_pixels() -> None:
    out = process_image(np.zeros((8, 8, 3), np.uint8), CONFIG)
    assert out.grid_thw == (1, 4, 4) and out.num_tokens == 4


def test_hash_framing_keeps_distinct_inputs_apart() -> None:
    assert hash_kwargs(a={"ab": "c"}) != hash_kwargs(a={"a": "bc"})
    assert hash_kwargs(a=[1, 2]) != hash_kwargs(a={"0": 1, "1": 2})
    assert hash_kwargs(a=None) != hash_kwargs(a="")
    assert hash_kwargs(a=[]) != hash_kwargs()
    assert hash_kwargs(a=1, b=2) == hash_kwargs(b=2, a=1)


def test_image_hash_depends_on_bytes_model_and_kwargs() -> None:
    raw = EncodedImage(b"\x89PNG...", None)
    base = image_hash("m", raw, {}, {}, None)
    assert base != image_hash("m2", raw, {}, {}, None)
    assert base != image_hash("m", EncodedImage(b"\x89PNG..!", None), {}, {}, None)
    assert base != image_hash("m", raw, {"max_pixels": 3136}, {}, None)
    assert base != image_hash("m", raw, {}, {"rgba_background_color": [0, 0, 0]}, None)
    converted = EncodedImage(
        raw.data, {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}
    )
    assert base != image_hash("m", converted, {}, {}, None)
    assert image_hash("m", raw, {}, {}, "uuid-1") == "uuid-1"
    assert image_hash("m", raw, {"max_pixels": 3136}, {}, "uuid-1") != "uuid-1"


def test_item_round_trips_through_msgpack() -> None:
    out = process_image(
        np.random.default_rng(3).integers(0, 256, (60, 30, 3), dtype=np.uint8), CONFIG
    )
    slices = serialize.batch_slices([out.pixel_values.shape[0], 10])
    encoded = serialize.encode_item(
        {
            "image_grid_thw": serialize.grid_field(out.grid_thw),
            "pixel_values": serialize.pixel_field(out.pixel_values, slices),
        }
    )
    decoded = serialize.decode_item(encoded)
    assert np.array_equal(decoded["pixel_values"]["array"], out.pixel_values)
    assert decoded["image_grid_thw"]["array"].tolist() == list(out.grid_thw)
    assert decoded["pixel_values"]["field"][1]["slices"] == [
        [[0, out.pixel_values.shape[0], None]],
        [[out.pixel_values.shape[0], out.pixel_values.shape[0] + 10, None]],
    ]


@pytest.mark.parametrize(
    ("grid", "row_width"),
    [
        ((1, 1, 1), 1),  # fixext 1
        ((1, 2, 2), 4),  # fixext 16
        ((1, 2, 5), 20),  # ext 8
        ((1, 4, 4), 1176),  # ext 16
        ((1, 8, 8), 1176),  # ext 32
    ],
)
def test_item_filled_in_place_is_the_item_encoded_whole(
    grid: tuple[int, int, int], row_width: int
) -> None:
    slices = serialize.batch_slices([grid[1] * grid[2], 3])
    item, rows, rows_at = serialize.image_item(grid, row_width, slices)
    pixels = np.random.default_rng(row_width).integers(0, 256, rows.shape, dtype=np.uint8)
    rows[:] = pixels
    whole = serialize.encode_item(
        {
            "image_grid_thw": serialize.grid_field(grid),
            "pixel_values": serialize.pixel_field(pixels, slices),
        }
    )
    assert bytes(item) == whole
    assert whole[rows_at : rows_at + pixels.size] == pixels.tobytes()


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=6))
def test_base64_pieces_join_into_the_whole(data: bytes, marks: list[int]) -> None:
    buffer = bytearray(data)
    pieces: list[bytes] = []
    sender = serialize.Base64Pieces(buffer, pieces.append)
    for end in sorted(min(mark, len(data)) for mark in marks):
        sender.filled(end)
    sender.close()
    assert b"".join(pieces) == base64.b64encode(data)
    assert serialize.encoded_size(len(data)) == len(b"".join(pieces))
    assert all(pieces)  # nothing empty is sent


@pytest.mark.parametrize(
    ("fmt", "mode"), [("JPEG", "RGB"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "L")]
)
def test_warm_up_compiles_what_decoded_images_need(fmt: str, mode: str) -> None:
    from render_service.multimodal import resample
    from render_service.multimodal.decode import decode_rgb, open_lazily

    resample.warm_up()
    kernels = (resample._resample_columns, resample._resample_rows_into_patches)
    compiled = [len(kernel.signatures) for kernel in kernels]
    data = image_bytes(30, 20, fmt, mode=mode)
    rgb = decode_rgb(open_lazily(data, 10**6), data, (255, 255, 255))
    resample.resize_bicubic_u8(rgb, 28, 56)
    assert [len(kernel.signatures) for kernel in kernels] == compiled


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_items_do_not_depend_on_what_their_memory_held(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Items are allocated uninitialized: every byte must be written, or a response could carry
    # leftovers of an earlier request. Fill the memory with a pattern and compare with zeros.
    from render_service.multimodal import work

    data = image_bytes(90, 60, fmt, seed=3)
    _, grid_h, grid_w = work.header_grid(data, 10**6, CONFIG)
    slices = serialize.batch_slices([grid_h * grid_w])

    def run(fill: int, cache_bytes: int) -> work.MediaItem:
        monkeypatch.setattr(serialize, "uninitialized_bytearray", lambda n: bytearray([fill] * n))
        job = work.Job(
            data=data,
            model_id="m",
            vision=CONFIG,
            background=(255, 255, 255),
            mm_kwargs={},
            io_kwargs={},
            uuid=None,
            max_pixels=10**6,
            slices=slices,
            cache_bytes=cache_bytes,
        )
        return work.run(job)

    zeros = run(0, 0)
    assert run(0xA5, 0) == zeros
    cache = 1 << 24
    run(0x5A, cache)  # fills the cache
    assert run(0xA5, cache) == zeros  # the item built from cached rows
