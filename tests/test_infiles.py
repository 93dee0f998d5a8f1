"""caramel.infiles: regular files only, no hang on a FIFO, symbolic links refused on request."""

from __future__ import annotations

import os

import pytest

from caramel.infiles import NotRegularFile, open_regular


def test_a_regular_file_is_read_with_its_status(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    with open_regular(p) as (f, st):
        assert f.read() == b"abc" and st.st_size == 3


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(NotRegularFile, match="is a folder") as info:
        with open_regular(tmp_path):
            pass
    assert info.value.is_dir and info.value.path == tmp_path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)  # a blocking open would wait here for ever: nobody writes
    with pytest.raises(NotRegularFile, match="not a regular file") as info:
        with open_regular(p):
            pass
    assert not info.value.is_dir


def test_a_device_is_refused():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(NotRegularFile, match="device, FIFO or socket"):
        with open_regular("/dev/zero"):
            pass


def test_a_symbolic_link_is_followed_or_refused(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(target)
    with open_regular(link) as (f, _):
        assert f.read() == b"x"
    with pytest.raises(OSError):
        with open_regular(link, follow=False):
            pass


def test_a_missing_file_is_the_open_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        with open_regular(tmp_path / "absent"):
            pass


# Bounded readers (caramel.infiles) and the files caramel reads through them.

import io  # noqa: E402
import json  # noqa: E402
import zipfile  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402

from caramel.infiles import BadData, TooLarge, npz_arrays, parse_json, read_bounded  # noqa: E402


def _npy_header(shape, dtype="<f8") -> bytes:
    """A .npy v1.0 header declaring ``shape`` (no data follows)."""
    head = repr({"descr": dtype, "fortran_order": False, "shape": tuple(shape)}).encode()
    head += b" " * (63 - (len(head) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head


def declaring(path, values: int, name: str = "x.npy"):
    """An .npz of a few hundred bytes whose member declares ``values`` float64 values."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name, _npy_header((values,)))
    return path  # a path, or the file object given


def zip_bomb(path, values: int):
    """An .npz whose member really holds ``values`` float64 zeros, deflated (about 1000 to 1)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as m:
            m.write(_npy_header((values,)))
            chunk = bytes(1 << 20)
            for _ in range(values * 8 >> 20):
                m.write(chunk)
    return path


def test_read_bounded_refuses_a_large_file_from_its_size(tmp_path):
    p = tmp_path / "sparse"
    with open(p, "wb") as f:
        f.truncate(5 << 30)  # 5 GiB, no disk: reading it would take 5 GiB of memory
    with pytest.raises(TooLarge, match="larger than the 1.0 MiB"):
        read_bounded(p, 1 << 20)
    p.write_bytes(b"abc")
    assert read_bounded(p, 3) == b"abc"


def test_npz_members_are_checked_from_their_headers(tmp_path):
    with pytest.raises(TooLarge, match="declares 10000000000 values"):
        npz_arrays(declaring(tmp_path / "big.npz", 10**10), max_bytes=1 << 20)
    bomb = zip_bomb(tmp_path / "bomb.npz", 20 << 20)  # 160 MiB of zeros in about 160 KiB
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(TooLarge):
        npz_arrays(bomb, max_bytes=1 << 20)
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(4.0), b=np.eye(2, dtype=np.complex128))
    got = npz_arrays(io.BytesIO(buf.getvalue()), max_bytes=4 * 8 + 4 * 16)
    assert list(got["a"]) == [0, 1, 2, 3] and got["b"].dtype == np.complex128
    with pytest.raises(TooLarge):
        npz_arrays(io.BytesIO(buf.getvalue()), max_bytes=4 * 8 + 4 * 16 - 1)


def test_npz_objects_short_data_and_strangers_are_bad_data(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, x=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(BadData, match="Python objects"):
        npz_arrays(io.BytesIO(buf.getvalue()), max_bytes=1 << 20)
    with pytest.raises(BadData, match="holds 0 bytes of data"):
        npz_arrays(declaring(tmp_path / "short.npz", 10), max_bytes=1 << 20)
    with zipfile.ZipFile(tmp_path / "odd.npz", "w") as z:
        z.writestr("x.txt", "hi")
    with pytest.raises(BadData, match="not an .npy array"):
        npz_arrays(tmp_path / "odd.npz", max_bytes=1 << 20)


@pytest.mark.parametrize("text,message", [
    ("[" * 100 + "]" * 100, "nested more than 64"), ("[" * 200000 + "]" * 200000, "nested more than 64"),
    ("1" * 5000, "integer of 5000 digits"), ('{"x": [NaN]}', "NaN is not a JSON number"), ("{", "not valid JSON"),
])
def test_parse_json_bounds(text, message):
    with pytest.raises(BadData, match=message):
        parse_json(text)
    assert parse_json('{"a": [1, {"b": -12}], "c": 1.5e3}') == {"a": [1, {"b": -12}], "c": 1500.0}
