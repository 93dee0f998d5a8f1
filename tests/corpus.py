"""Where the tests find the compiled corpus, in one place.

The corpus (``programs/`` of the shared repository: the compiled programs and
``BootstrapLike_51L.tar.xz``) is not part of this repository. It is looked for, first found wins:

1. ``$CARAMEL_SHARED_PROGRAMS``;
2. ``$CARAMEL_PROGRAMS`` (the name the GPU scripts set);
3. ``../shared/programs`` beside the checkout (the layout of a development machine);
4. ``.data/corpus`` in the checkout (what the GPU machine's copy holds).

Without any of them every test that reads the corpus skips (never fails, never errors at
collection): :func:`corpus` and :func:`corpus_names` are empty, :func:`shared` and
:func:`load_corpus` skip the calling test, :func:`needs` marks a test to skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _candidates() -> list[Path]:
    found = [Path(os.environ[v]) for v in ("CARAMEL_SHARED_PROGRAMS", "CARAMEL_PROGRAMS") if os.environ.get(v)]
    return found + [REPO.parent / "shared" / "programs", REPO / ".data" / "corpus"]


def _locate() -> Path:
    candidates = _candidates()
    return next((p for p in candidates if p.is_dir()), candidates[0])


#: The corpus folder (it may not exist: then every test that needs it skips).
SHARED_PROGRAMS = _locate()
#: Why a test that needs the corpus skipped.
MISSING = f"compiled corpus not found at {SHARED_PROGRAMS} (set CARAMEL_SHARED_PROGRAMS)"


def present() -> bool:
    """Whether the corpus folder exists."""
    return SHARED_PROGRAMS.is_dir()


def corpus(pattern: str = "*_*c") -> list[Path]:
    """Program folders of the corpus matching ``pattern`` (empty when it is absent)."""
    if not present():
        return []
    return sorted(p for p in SHARED_PROGRAMS.glob(pattern) if p.is_dir())


def corpus_names(limbs=(4, 10), chips=(1, 2, 4, 8)) -> list[str]:
    """Names ``<Family>_<L>L_<K>c`` of the corpus programs with these limb and chip counts (empty
    when the corpus is absent)."""
    want_l, want_c = {f"{l}L" for l in limbs}, {f"{c}c" for c in chips}
    names = []
    for d in corpus("*_*"):
        parts = d.name.split("_")
        if len(parts) == 3 and parts[1] in want_l and parts[2] in want_c:
            names.append(d.name)
    return names


def shared(name: str) -> Path:
    """``SHARED_PROGRAMS / name`` (a program folder or an archive); the calling test skips when it
    is absent."""
    path = SHARED_PROGRAMS / name
    if not path.exists():
        pytest.skip(f"{name}: {MISSING}" if not present() else f"{name} is not in the corpus at {SHARED_PROGRAMS}")
    return path


def has(*names: str) -> bool:
    """Whether every one of ``names`` is in the corpus."""
    return all((SHARED_PROGRAMS / n).exists() for n in names)


def needs(*names: str) -> pytest.MarkDecorator:
    """Mark a test (or with ``pytestmark``, a module) to skip unless every one of ``names`` is in
    the corpus (no names: the corpus folder itself)."""
    ok = has(*names) if names else present()
    return pytest.mark.skipif(not ok, reason=MISSING if not present() else f"{', '.join(names)} not in the corpus")


def load_corpus(name: str, **kwargs):
    """A program of the corpus, parsed (``caramel.load_program``); BootstrapLike_51L_<K>c comes
    from its archive. The calling test skips when it is absent."""
    from caramel.parse import load_program

    if name.startswith("BootstrapLike_51L"):
        return load_program(f"{shared('BootstrapLike_51L.tar.xz')}#{name}", **kwargs)
    return load_program(shared(name), **kwargs)
