"""The perceptual hash: what it is invariant to, what tells images apart, every decode path."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from helpers import encode, near_copy, photo_like

from packer.duplicates.phash import (COEFFICIENTS, FLAT, FLIP_MASK, HASHED, grey_from_pixels, grey_pixels, hamming,
                                     hash_pixels, perceptual_hash)
from packer.errors import DecodeError


def _hash(data: bytes, **kwargs: object) -> np.ndarray:
    words, status = hash_pixels(grey_pixels(data, **kwargs))
    assert status == HASHED
    return words


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    return [photo_like(seed) for seed in range(24)]


def test_the_bits_are_the_128_lowest_frequencies_in_anti_diagonal_order() -> None:
    assert len(COEFFICIENTS) == 128 and len(set(COEFFICIENTS)) == 128
    assert COEFFICIENTS[:5] == ((0, 1), (1, 0), (0, 2), (1, 1), (2, 0))
    assert [v + u for v, u in COEFFICIENTS] == sorted(v + u for v, u in COEFFICIENTS)
    assert (0, 0) not in COEFFICIENTS  # the DC term (brightness) never votes
    odd = [k for k, (_, u) in enumerate(COEFFICIENTS) if u % 2]
    assert int(FLIP_MASK[0]) | (int(FLIP_MASK[1]) << 64) == sum(1 << k for k in odd)


def test_near_copies_stay_close_and_distinct_photos_stay_far(photos: list[np.ndarray]) -> None:
    hashes = np.array([_hash(encode(p)) for p in photos])
    distinct = hamming(hashes[:, None], hashes[None])[np.triu_indices(len(photos), 1)]
    assert distinct.min() > 30  # of 128 bits: unrelated images differ in about half
    for kind, bound in (("quality", 6), ("resize", 10), ("crop", 16), ("jitter", 8), ("png", 10)):
        for seed in range(8):
            assert hamming(hashes[seed], _hash(near_copy(photos[seed], kind, seed))) <= bound, (kind, seed)


def test_a_mirror_image_is_the_hash_xor_the_flip_mask(photos: list[np.ndarray]) -> None:
    for seed in range(6):
        pixels = photos[seed]
        mirrored = np.ascontiguousarray(pixels[:, ::-1])
        plain, flipped = _hash(encode(pixels, "png")), _hash(encode(mirrored, "png"))
        assert hamming(plain ^ FLIP_MASK, flipped) <= 2  # exact but for coefficients within rounding of 0
        assert hamming(plain, flipped) > 20


def test_brightness_and_contrast_do_not_move_the_signs(photos: list[np.ndarray]) -> None:
    grey = np.asarray(Image.fromarray(photos[0]).convert("L"), dtype=np.float64)
    base, _ = hash_pixels(grey)
    for gain, offset in ((1.1, 0), (0.9, 12), (1.0, -20)):
        assert hamming(base, hash_pixels(grey * gain + offset)[0]) <= 1


def test_every_decode_path_gives_nearly_the_same_hash(photos: list[np.ndarray]) -> None:
    pixels = photos[3]
    reference = _hash(encode(pixels, "png"))
    grey_jpeg = io.BytesIO()
    Image.fromarray(pixels).convert("L").save(grey_jpeg, "JPEG", quality=92)
    cmyk = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG", quality=92)
    webp = io.BytesIO()
    Image.fromarray(pixels).save(webp, "WEBP", quality=92)
    for data in (encode(pixels), grey_jpeg.getvalue(), cmyk.getvalue(), webp.getvalue()):
        assert hamming(reference, _hash(data)) <= 10
    raw, status = hash_pixels(grey_from_pixels(pixels))  # stored pixels (codec raw), RGB and RGBA alike
    assert status == HASHED and hamming(reference, raw) <= 4
    rgba = np.concatenate([pixels, np.full(pixels.shape[:2] + (1,), 255, np.uint8)], axis=2)
    assert np.array_equal(hash_pixels(grey_from_pixels(rgba))[0], raw)
    assert perceptual_hash(encode(pixels)) == (int(_hash(encode(pixels))[0]), int(_hash(encode(pixels))[1]))


def test_the_jpeg_path_decodes_small(monkeypatch: pytest.MonkeyPatch) -> None:
    import simplejpeg

    seen = []
    real = simplejpeg.decode_jpeg

    def spy(data, **kwargs):  # noqa: ANN001, ANN003, ANN202
        out = real(data, **kwargs)
        seen.append((kwargs.get("colorspace"), out.shape))
        return out

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    grey_pixels(encode(photo_like(1, (1024, 768))))
    assert seen == [("GRAY", (128, 96, 1))]  # 1/8 scale, luma only


def test_flat_images_have_no_hash_and_bad_bytes_are_refused() -> None:
    assert hash_pixels(np.full((40, 40), 77, np.uint8))[1] == FLAT
    assert perceptual_hash(encode(np.full((64, 64, 3), 200, np.uint8), "png")) is None
    with pytest.raises(DecodeError, match="expected a JPEG, PNG"):
        grey_pixels(b"definitely not an image")
    with pytest.raises(DecodeError, match="over the limit"):
        grey_pixels(encode(photo_like(2, (64, 64))), max_pixels=1000)


def test_the_hash_of_a_fixed_image_is_frozen() -> None:
    """Algorithm 1's values: a change here must bump the algorithm number (SPEC §16)."""
    y, x = np.mgrid[0:64, 0:96]
    grey = (128 + 60 * np.sin(x / 9.0) * np.cos(y / 13.0) + 0.4 * x - 0.3 * y).astype(np.float64)
    words, status = hash_pixels(grey)
    assert status == HASHED
    assert [f"{int(w):016x}" for w in words] == FROZEN


FROZEN = ["4a569a4acd156eda", "54d2a95aa6952b53"]
