"""A key store: a folder holding a :class:`~caramel.ckks.keyset.KeySet` (secrets and evaluation keys).

The store holds the SECRET KEY: whoever reads it can decrypt. The folder is created with mode 0700
and every file with mode 0600. Layout (data only, nothing in it can execute code)::

    DIR/manifest.json      format tag and version, N, primes, secret distributions, key seed,
                           program, every key (id, limbs, files) and the SHA-256 of every file
    DIR/secrets.npz        s and s_eph, int8 coefficients in {-1, 0, 1} (allow_pickle=False)
    DIR/keys/K.c0.npy      evaluation key K's halves, (limbs, N) uint32, NTT form
    DIR/keys/K.c1.npy

Writes go to a temporary file created exclusively in the same folder (``mkstemp``), then
``os.replace`` (atomic), so a planted symlink is never followed; the manifest is written last, so a folder whose
writing was interrupted is no key store. Loading checks the format, N and primes against the
context, the digest of every file, every array's dtype and shape, and (:func:`require_keys`) that
the store has every key a program needs; it reads files in parallel threads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from caramel.ckks.keys import EvalKey, PendingKeys, SecretDist, SecretKey, Secrets, key_limbs
from caramel.ckks.keyset import KeySet
from caramel.errors import CaramelError
from caramel.outfiles import replace_atomically
from caramel.program import EvalKeyId, KeyType

#: ``format`` of the manifest and its version.
FORMAT = "caramel-keys"
VERSION = 1
MANIFEST = "manifest.json"
SECRETS = "secrets.npz"
KEYS_DIR = "keys"
_FILE_MODE = 0o600
_DIR_MODE = 0o700


class KeyStoreError(CaramelError):
    """A folder that is no key store, a damaged one, or one made for another context or program."""


# Writing.


def _write_atomic(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically (mode 0600, synced; :func:`caramel.outfiles.replace_atomically`)
    and return its SHA-256."""
    replace_atomically(path, data, mode=_FILE_MODE, sync=True)
    return hashlib.sha256(data).hexdigest()


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def _make_dir(path: Path) -> None:
    if path.is_symlink():
        raise KeyStoreError(f"{path}: is a symbolic link; a key store must be a real folder")
    path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    if not path.is_dir():
        raise KeyStoreError(f"{path}: exists and is not a folder")
    os.chmod(path, _DIR_MODE)


def _dist_json(dist: SecretDist) -> dict:
    return {"name": str(dist), "hamming_weight": dist.hamming_weight}


def _key_json(key_id: EvalKeyId) -> dict:
    return {"type": int(key_id.type), "level": key_id.level, "ext": key_id.ext, "rot": key_id.rot,
            "digits": list(key_id.digits)}


def save_keys(keyset: KeySet, ctx, directory: str | Path, *, key_seed: int | None = None,
              program: str | None = None) -> Path:
    """Write ``keyset`` (made for context ``ctx``) to the key store ``directory``; returns its path.

    An existing folder must be empty or a key store (its files are replaced)."""
    root = Path(directory)
    _make_dir(root)
    existing = [p.name for p in root.iterdir()]
    if existing and MANIFEST not in existing:
        raise KeyStoreError(f"{root}: folder is not empty and is no key store; refusing to write into it")
    old_manifest = root / MANIFEST
    if old_manifest.exists():
        old_manifest.unlink()  # a half-replaced store must not pass for a whole one
    _make_dir(root / KEYS_DIR)
    for stale in (root / KEYS_DIR).iterdir():
        if stale.name.endswith(".npy") and not stale.is_symlink():
            stale.unlink()
    sec = keyset.secrets
    files: dict[str, str] = {}
    buf = io.BytesIO()
    np.savez(buf, s=sec.s.coeffs.astype(np.int8), s_eph=sec.s_eph.coeffs.astype(np.int8))
    files[SECRETS] = _write_atomic(root / SECRETS, buf.getvalue())
    keys = []
    for i, (kid, key) in enumerate(keyset.keys.items()):
        entry = {"id": _key_json(kid), "text": str(kid), "limbs": list(key.limbs)}
        for half, arr in (("c0", key.c0), ("c1", key.c1)):
            rel = f"{KEYS_DIR}/{i:04d}.{half}.npy"
            files[rel] = _write_atomic(root / rel, _npy_bytes(np.asarray(arr, dtype=np.uint32)))
            entry[half] = rel
        keys.append(entry)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "n": int(ctx.n),
        "primes": [int(q) for q in ctx.primes],
        "secrets": {"s": _dist_json(sec.s.dist), "s_eph": _dist_json(sec.s_eph.dist)},
        "key_seed": key_seed,
        "program": program,
        "keys": keys,
        "sha256": files,
    }
    _write_atomic(root / MANIFEST, json.dumps(manifest, indent=1).encode())
    return root


# Reading.


def _read_file(root: Path, rel: str, digests: dict[str, str]) -> bytes:
    """The bytes of ``root/rel`` (no symlinks, inside root), checked against the manifest's SHA-256."""
    if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel not in digests:
        raise KeyStoreError(f"{root / MANIFEST}: bad or undigested file name {rel!r}")
    path = root / rel
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise KeyStoreError(f"{path}: cannot open ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise KeyStoreError(f"{path}: not a regular file")
        data = f.read()
    if hashlib.sha256(data).hexdigest() != digests[rel]:
        raise KeyStoreError(f"{path}: SHA-256 differs from the manifest (file damaged or altered)")
    return data


def _npy_array(data: bytes, where: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    try:
        buf = io.BytesIO(data)
        major, _ = np.lib.format.read_magic(buf)
        if major == 1:
            hdr = np.lib.format.read_array_header_1_0(buf)
        else:
            hdr = np.lib.format.read_array_header_2_0(buf)
    except (ValueError, OSError) as exc:
        raise KeyStoreError(f"{where}: not a .npy array ({exc})") from None
    got_shape, fortran, got_dtype = hdr
    if got_dtype != np.dtype(dtype) or tuple(got_shape) != shape or fortran:
        raise KeyStoreError(f"{where}: array is {got_dtype} {tuple(got_shape)}, expected {np.dtype(dtype)} {shape}")
    arr = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=buf.tell()).reshape(shape)
    return arr  # read-only (a view of bytes)


def _field(obj: dict, name: str, kind, where: Path):
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KeyStoreError(f"{where}: manifest field {name!r} is missing or not {getattr(kind, '__name__', kind)}")
    return value


def _dist(obj, where: Path) -> SecretDist:
    if not isinstance(obj, dict):
        raise KeyStoreError(f"{where}: secret distribution is not an object")
    h = obj.get("hamming_weight")
    if h is not None and (not isinstance(h, int) or isinstance(h, bool) or h < 0):
        raise KeyStoreError(f"{where}: bad hamming_weight {h!r}")
    return SecretDist(h)


def _key_id(obj, where: Path) -> EvalKeyId:
    try:
        digits = tuple(int(d) for d in obj["digits"])
        kid = EvalKeyId(KeyType(int(obj["type"])), int(obj["level"]), int(obj["ext"]), int(obj["rot"]), digits)
    except (KeyError, TypeError, ValueError):
        raise KeyStoreError(f"{where}: bad key id {obj!r}") from None
    return kid


def read_manifest(directory: str | Path) -> dict:
    """The checked manifest of the key store ``directory`` (format and version)."""
    root = Path(directory)
    if root.is_symlink() or not root.is_dir():
        raise KeyStoreError(f"{root}: no such folder (a key store is a folder made by `caramel keys`)")
    where = root / MANIFEST
    if not where.is_file() or where.is_symlink():
        raise KeyStoreError(f"{root}: not a key store (no {MANIFEST}; make one with `caramel keys`)")
    try:
        manifest = json.loads(where.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyStoreError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KeyStoreError(f"{where}: not a caramel key store manifest")
    if manifest.get("version") != VERSION:
        raise KeyStoreError(f"{where}: format version {manifest.get('version')!r}, this caramel reads {VERSION}")
    return manifest


def load_keys(directory: str | Path, ctx, *, threads: int | None = None, background: bool = False,
              on_device: bool = False) -> KeySet:
    """Load the key store ``directory`` for context ``ctx`` (N and primes must match); see module docstring.

    ``background``: return once the manifest and the secrets are read and checked; the evaluation
    keys' files are read on by a thread pool (the key set's ``keys`` is a :class:`PendingKeys`), so
    that they load while the caller encrypts its inputs. ``on_device``: each key half, once read and
    checked, is copied to the current GPU by its loading thread (:func:`_device_copy`; for a 1-GPU
    run, whose executor copies device rows into its arena there)."""
    root = Path(directory)
    manifest = read_manifest(root)
    where = root / MANIFEST
    n = _field(manifest, "n", int, where)
    primes = _field(manifest, "primes", list, where)
    if n != ctx.n:
        raise KeyStoreError(f"{root}: keys were made for N = {n}, this run has N = {ctx.n}")
    if [int(q) for q in primes] != [int(q) for q in ctx.primes]:
        raise KeyStoreError(f"{root}: keys were made for other primes than this run's context")
    digests = _field(manifest, "sha256", dict, where)
    entries = _field(manifest, "keys", list, where)
    secrets_meta = _field(manifest, "secrets", dict, where)
    jobs: list[tuple[object, np.ndarray | None]] = [(SECRETS, None)]
    ids = []
    for entry in entries:
        kid = _key_id(entry.get("id") if isinstance(entry, dict) else None, where)
        limbs = key_limbs(kid)
        if list(entry.get("limbs", [])) != list(limbs):
            raise KeyStoreError(f"{where}: key {kid} lists limbs {entry.get('limbs')!r}, expected {list(limbs)}")
        ids.append((kid, limbs))
        moduli = np.asarray(ctx.moduli(limbs), dtype=np.uint32).reshape(-1, 1)
        jobs += [(entry.get("c0"), moduli), (entry.get("c1"), moduli)]
    workers = threads or min(16, os.cpu_count() or 1)

    def load(job):
        rel, moduli = job
        data = _read_file(root, rel, digests)
        if moduli is None:
            return data
        arr = _npy_array(data, root / rel, np.uint32, (moduli.shape[0], n))
        if np.any(arr >= moduli):
            raise KeyStoreError(f"{root / rel}: holds residues outside [0, q)")
        return _device_copy(arr) if on_device else arr

    if background:
        secrets = _secrets(load(jobs[0]), root / SECRETS, n, secrets_meta, where)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="caramel-keys")
        futures = [pool.submit(load, job) for job in jobs[1:]]
        pool.shutdown(wait=False)  # the threads end when the files are read
        return KeySet(secrets, PendingKeys(ids, futures))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        arrays = list(pool.map(load, jobs))
    secrets = _secrets(arrays[0], root / SECRETS, n, secrets_meta, where)
    keys = {kid: EvalKey(kid, limbs, arrays[1 + 2 * i], arrays[2 + 2 * i]) for i, (kid, limbs) in enumerate(ids)}
    return KeySet(secrets, keys)


def _device_copy(arr: np.ndarray):
    """``arr`` copied to the current GPU (CuPy; a loading thread waits for CuPy's import and the CUDA
    context only, not for the rest of :func:`caramel.ckks.device.warm_up`)."""
    import cupy

    return cupy.asarray(arr)


def _secrets(data: bytes, path: Path, n: int, meta: dict, where: Path) -> Secrets:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            s, eph = z["s"], z["s_eph"]
    except (ValueError, KeyError, OSError) as exc:
        raise KeyStoreError(f"{path}: not the secrets archive ({exc})") from None
    parts = []
    for name, arr in (("s", s), ("s_eph", eph)):
        if arr.dtype != np.int8 or arr.shape != (n,) or np.any(np.abs(arr.astype(np.int64)) > 1):
            raise KeyStoreError(f"{path}: secret {name} is not {n} ternary int8 coefficients")
        dist = _dist(meta.get(name), where)
        coeffs = arr.astype(np.int64)
        if dist.hamming_weight is not None and int(np.count_nonzero(coeffs)) != dist.hamming_weight:
            raise KeyStoreError(f"{path}: secret {name} does not have Hamming weight {dist.hamming_weight}")
        parts.append(SecretKey(coeffs, dist))
    return Secrets(*parts)


def require_keys(keyset: KeySet, needed, where: str | Path) -> None:
    """Raise KeyStoreError naming the keys of ``needed`` that ``keyset`` lacks."""
    missing = [k for k in needed if k not in keyset.keys]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise KeyStoreError(f"{where}: the key store has no key {shown}; it was made for another program "
                            "(run `caramel keys` for this one)")
