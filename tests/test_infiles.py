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
