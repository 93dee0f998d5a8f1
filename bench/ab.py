"""An earlier commit's tree beside the working tree, so that one device call times both on one GPU (timings compare
only within one call or one warm machine).

    here:        python -m bench ab prepare REV [--dir .ab]   # REV's tracked files in .ab/ (git-ignored), a manifest
    the device:  python -m bench replay --base .ab            # the harness times both trees, alternating
                 python -m bench ab run [--dir .ab] -- CMD... # or any command, run inside the copy

``--dir`` (a folder of the repository root, default ``.ab``) names the copy, so that one call can time several earlier
commits. Carry the copy with the device call (``run``'s carry: ``[".ab", ".data", ...]``). The copy to the device may
leave a file of the copy that equals the working tree's as a dangling link: :func:`ready` copies the working tree's
file in its place, then checks every file against the manifest (exit status 2 on a difference) and links the working
tree's ``.data`` and ``.whl`` into the copy.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

MANIFEST = ".manifest"
#: Folders of the working tree that a copy links to instead of holding: the programs and wheels a call carries.
LINKED = (".data", ".whl")


def _fail(message: str) -> SystemExit:
    print(f"bench ab: {message}", file=sys.stderr)
    return SystemExit(2)


def _files(where: Path) -> list[Path]:
    """Every regular file under ``where`` but the manifest and the linked folders, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(where):
        if Path(dirpath) == where:
            dirnames[:] = [d for d in dirnames if d not in LINKED]
        out += [Path(dirpath, f) for f in filenames]
    return sorted(p for p in out if p.relative_to(where).as_posix() != MANIFEST and not p.is_symlink())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare(rev: str, where: str | Path = ".ab", repo: Path | None = None) -> Path:
    """Put commit ``rev``'s tracked files into ``where`` (a folder of the repository ``repo``, default the current
    folder's), replacing what was there, with a manifest of their SHA-256 and a ``.rev`` file; add the folder to the
    repository's ``info/exclude`` unless git ignores it already. SystemExit (2) when ``rev`` is no commit."""
    repo = Path(repo or Path.cwd())
    ok = subprocess.run(["git", "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=repo, capture_output=True)
    if ok.returncode:
        raise _fail(f"no commit {rev}")
    target = repo / where
    if target.is_symlink() or target.exists():
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=repo, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    lines = [f"{_sha256(p)}  ./{p.relative_to(target).as_posix()}\n" for p in _files(target)]
    (target / MANIFEST).write_text("".join(lines))
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=repo, capture_output=True, text=True,
                           check=True).stdout.strip()
    (target / ".rev").write_text(short + "\n")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(Path(where) / MANIFEST)], cwd=repo).returncode == 0
    if not ignored:  # (caramel's .gitignore covers /.ab*/) kept out of `git status` and of the device's copy
        exclude = Path(subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=repo,
                                      capture_output=True, text=True, check=True).stdout.strip())
        exclude = exclude if exclude.is_absolute() else repo / exclude
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write(f"/{Path(where).as_posix().strip('/')}/\n")
    print(f"{Path(where).as_posix()}/ holds {short} ({len(lines)} files); carry it with the device call")
    return target


def ready(where: Path, repo: Path | None = None) -> Path:
    """The copy ``where`` made ready to run in: each dangling link (but the linked folders) replaced by the working
    tree's file of that path, every file checked against the manifest (SystemExit 2 on a difference or a missing
    manifest), the working tree's ``.data`` and ``.whl`` linked in. Returns ``where`` resolved."""
    repo = Path(repo or Path.cwd()).resolve()
    where = Path(where)
    where = (where if where.is_absolute() else repo / where).resolve()
    if not (where / MANIFEST).is_file():
        raise _fail(f"no {where.name}/{MANIFEST}: run 'python -m bench ab prepare REV' first")
    for dirpath, dirnames, filenames in os.walk(where):
        for name in dirnames + filenames:
            link = Path(dirpath, name)
            rel = link.relative_to(where)
            if link.is_symlink() and not link.exists() and rel.parts[0] not in LINKED:
                src = repo / rel
                if not src.is_file():
                    raise _fail(f"{link} is a dangling link and {src} does not exist")
                link.unlink()
                shutil.copyfile(src, link)
    for line in (where / MANIFEST).read_text().splitlines():
        digest, _, name = line.partition("  ")
        path = where / name
        if not path.is_file() or _sha256(path) != digest:
            raise _fail(f"{where.name}/ differs from its manifest ({name})")
    for name in LINKED:
        if (repo / name).exists() and not (where / name).exists():
            (where / name).symlink_to(repo / name)
    return where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench ab", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare", help="put commit REV's tracked files into DIR, with a manifest")
    p.add_argument("rev")
    p.add_argument("--dir", default=".ab", help="the copy, a folder of the repository root (default .ab)")
    r = sub.add_parser("run", help="check DIR against its manifest, then run CMD inside it")
    r.add_argument("--dir", default=".ab")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")
    args = ap.parse_args(argv)
    try:
        if args.what == "prepare":
            prepare(args.rev, args.dir)
            return 0
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            raise _fail("usage: python -m bench ab run [--dir DIR] -- CMD [ARGS...]")
        where = ready(Path(args.dir))
    except SystemExit as e:
        return int(e.code or 0)
    return subprocess.run(cmd, cwd=where).returncode


if __name__ == "__main__":
    raise SystemExit(main())
