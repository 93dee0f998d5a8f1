"""scripts/gpu_ab.sh, the same-call baseline tree for device timings: prepared from a commit, repaired and checked
against its manifest before a command runs in it (no GPU needed)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_ab.sh"
pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("sha256sum") is None,
                                reason="needs git and sha256sum")


def sh(cwd, *args, check=True):
    r = subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True)
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
    out = sh(repo, "prepare", "HEAD~1").stdout
    assert ".ab/ holds" in out and "(2 files)" in out  # a.txt and sub/b.txt (.rev is written after the manifest)
    assert (repo / ".ab" / "a.txt").read_text() == "1\n"
    assert "/.ab/" in (repo / ".git" / "info" / "exclude").read_text().split()
    (repo / ".data").mkdir()
    r = sh(repo, "run", "cat", "a.txt", ".data/../sub/b.txt")
    assert r.stdout == "1\nsame\n"  # run in .ab/, with the working tree's .data linked in
    assert (repo / ".ab" / ".data").is_symlink()
    sh(repo, "prepare", "HEAD~1")  # again: the exclude line is not repeated
    assert (repo / ".git" / "info" / "exclude").read_text().split().count("/.ab/") == 1


def test_a_dangling_link_is_repaired_from_the_working_tree(repo):
    sh(repo, "prepare", "HEAD~1")
    b = repo / ".ab" / "sub" / "b.txt"
    b.unlink()
    b.symlink_to("/nonexistent/sub/b.txt")
    assert sh(repo, "run", "cat", "sub/b.txt").stdout == "same\n"
    assert not b.is_symlink()


def test_a_file_that_differs_from_the_manifest_stops_the_run(repo):
    sh(repo, "prepare", "HEAD~1")
    a = repo / ".ab" / "a.txt"
    a.unlink()
    a.symlink_to("/nonexistent/a.txt")  # the working tree's a.txt is "2": not the file of HEAD~1
    r = sh(repo, "run", "cat", "a.txt", check=False)
    assert r.returncode == 2 and "differs from its manifest" in r.stderr and r.stdout == ""


def test_usage_errors(repo):
    assert sh(repo, "run", "true", check=False).returncode == 2  # not prepared
    assert sh(repo, "prepare", "nosuchrev", check=False).returncode == 2
    assert sh(repo, check=False).returncode == 2
    sh(repo, "prepare", "HEAD")
    assert sh(repo, "run", check=False).returncode == 2
