"""bench/ab.py, the same-call baseline tree of device timings: an earlier commit's files copied with a manifest,
repaired and checked against it before a command runs in it (no GPU needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def ab(cwd, *args, check=True):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "bench", "ab", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def repo(tmp_path):
    """Two commits: a.txt "1" -> "2"; sub/b.txt the same in both."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, env=env)

    git("init", "-q")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("same\n")
    (tmp_path / "a.txt").write_text("1\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    (tmp_path / "a.txt").write_text("2\n")
    git("commit", "-qam", "two")
    return tmp_path


def test_prepare_then_run_in_the_old_tree(repo):
    out = ab(repo, "prepare", "HEAD~1").stdout
    assert ".ab/ holds" in out and "(2 files)" in out  # a.txt and sub/b.txt (.rev is written after the manifest)
    assert (repo / ".ab" / "a.txt").read_text() == "1\n"
    assert "/.ab/" in (repo / ".git" / "info" / "exclude").read_text().split()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert ".ab" not in status
    (repo / ".data").mkdir()
    r = ab(repo, "run", "--", "cat", "a.txt", ".data/../sub/b.txt")
    assert r.stdout == "1\nsame\n"  # run in .ab/, with the working tree's .data linked in
    assert (repo / ".ab" / ".data").is_symlink()
    ab(repo, "prepare", "HEAD~1")  # again: the exclude line is not repeated
    assert (repo / ".git" / "info" / "exclude").read_text().split().count("/.ab/") == 1


def test_a_second_copy_by_dir(repo):
    ab(repo, "prepare", "HEAD", "--dir", ".ab2")
    ab(repo, "prepare", "HEAD~1")
    assert ab(repo, "run", "--dir", ".ab2", "--", "cat", "a.txt").stdout == "2\n"
    assert ab(repo, "run", "--", "cat", "a.txt").stdout == "1\n"
    assert (repo / ".ab2" / ".rev").read_text().strip() != (repo / ".ab" / ".rev").read_text().strip()


def test_a_dangling_link_is_repaired_from_the_working_tree(repo):
    ab(repo, "prepare", "HEAD~1")
    b = repo / ".ab" / "sub" / "b.txt"
    b.unlink()
    b.symlink_to("/nonexistent/sub/b.txt")
    assert ab(repo, "run", "--", "cat", "sub/b.txt").stdout == "same\n"
    assert not b.is_symlink()


def test_a_file_that_differs_from_the_manifest_stops_the_run(repo):
    ab(repo, "prepare", "HEAD~1")
    a = repo / ".ab" / "a.txt"
    a.unlink()
    a.symlink_to("/nonexistent/a.txt")  # the working tree's a.txt is "2": not the file of HEAD~1
    r = ab(repo, "run", "--", "cat", "a.txt", check=False)
    assert r.returncode == 2 and "differs from its manifest" in r.stderr and r.stdout == ""


def test_usage_errors(repo):
    r = ab(repo, "run", "--", "true", check=False)
    assert r.returncode == 2 and "prepare REV" in r.stderr  # not prepared
    r = ab(repo, "prepare", "nosuchrev", check=False)
    assert r.returncode == 2 and "no commit nosuchrev" in r.stderr
    assert ab(repo, check=False).returncode == 2
    ab(repo, "prepare", "HEAD")
    assert ab(repo, "run", check=False).returncode == 2
