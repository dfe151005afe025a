"""Keys are one-to-one with source names (issue 38): ``packer._internal.names`` escapes every name that is not
plain text, reversibly, and no two names share a key, whatever their bytes; a Latin-1 name and its
percent-escaped spelling in one folder both pack, under two keys, and export back to both names."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from helpers import jpeg_bytes

import packer
from packer._internal.names import escape_name, is_plain, source_name, unescape_key

def jpeg(seed: int) -> bytes:
    return jpeg_bytes(10 + seed, 12)


#: Byte strings that look like names: text, percent signs, hex digits and stray high bytes mixed.
_PIECES = st.sampled_from([b"%", b"%2", b"%25", b"%E9", b"%e9", b"%G1", b"%FF", b"\xe9", b"\xff", b"\xc3\xa9",
                           b"\xc3", b"\xed\xa0\x80", b"a", b"Z", b"0", b"9", b"E", b".jpg", b"/", b" ", "é".encode()])
NAMES = st.one_of(st.binary(max_size=24), st.lists(_PIECES, max_size=8).map(b"".join))


@given(NAMES, NAMES)
@example(b"caf\xe9.jpg", b"caf%E9.jpg")
@example(b"100%.jpg", b"100%25.jpg")
@example(b"%25", b"%")
@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
def test_two_different_names_never_share_a_key(first: bytes, second: bytes) -> None:
    assume(first != second)
    assert escape_name(first) != escape_name(second)


@given(NAMES)
@example(b"caf%E9.jpg")
@example(b"a%41\xff")
@settings(max_examples=3000)
def test_a_key_gives_its_name_back(name: bytes) -> None:
    key = escape_name(name)
    key.encode("utf-8")  # a key is UTF-8 text (SPEC §5)
    escaped = not is_plain(name)
    assert unescape_key(key, escaped) == name
    if escaped:
        assert source_name(key, b'{"escaped_name":true}') == name
    else:
        assert key == name.decode("utf-8")  # a plain name is its own key


def test_plain_names_are_unchanged() -> None:
    for name in ("cat/0.jpg", "100%.jpg", "50% off.png", "%zz.jpg", "日本/写真.jpg", "a%e9.jpg"):
        assert is_plain(name.encode()) and escape_name(name.encode()) == name
    assert escape_name(b"caf\xe9.jpg") == "caf%E9.jpg"
    assert escape_name(b"caf%E9.jpg") == "caf%25E9.jpg"


@pytest.mark.skipif(sys.platform != "linux", reason="byte names need a POSIX file system")
def test_a_latin1_name_and_its_escaped_spelling_both_pack_and_export(tmp_path) -> None:
    """Before: both got the key ``caf%E9.jpg`` and one was dropped as a duplicate (exit 0)."""
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    latin1 = os.fsencode(src / "cat") + b"/caf\xe9.jpg"
    spelled = src / "cat" / "caf%E9.jpg"
    with open(latin1, "wb") as file:
        file.write(jpeg(1))
    spelled.write_bytes(jpeg(2))
    result = packer.build_dataset(src, tmp_path / "ds", run=packer.RunOptions(workers=1))
    assert result.sample_count == 2 and not [r for r in result.rejected if r.reason == "duplicate-entry"]
    with packer.open_dataset(tmp_path / "ds") as dataset:
        keys = sorted(dataset.key(i) for i in range(len(dataset)))
        assert keys == ["cat/caf%25E9.jpg", "cat/caf%E9.jpg"]
        by_key = {dataset.key(i): bytes(dataset.get(i)) for i in range(len(dataset))}
    assert by_key["cat/caf%E9.jpg"] == jpeg(1) and by_key["cat/caf%25E9.jpg"] == jpeg(2)
    from click.testing import CliRunner

    from packer.cli import _register, cli

    _register()
    out = tmp_path / "exported"
    done = CliRunner().invoke(cli, ["export", str(tmp_path / "ds"), str(out)])
    assert done.exit_code == 0, done.output
    names = sorted(os.listdir(os.fsencode(out / "cat")))
    assert names == [b"caf%E9.jpg", b"caf\xe9.jpg"]
    with open(os.fsencode(out / "cat") + b"/caf\xe9.jpg", "rb") as file:
        assert file.read() == jpeg(1)
    assert (out / "cat" / "caf%E9.jpg").read_bytes() == jpeg(2)
