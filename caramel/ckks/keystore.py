"""A key store: a folder holding a :class:`~caramel.ckks.keyset.KeySet` (secrets and evaluation keys).

The store holds the SECRET KEY: whoever reads it can decrypt. The folder is created with mode 0700
and every file with mode 0600. Layout (data only, nothing in it can execute code)::

    DIR/manifest.json      format tag and version, N, primes, secret distributions, key seed,
                           program, every key (id, limbs, files, a_state) and the SHA-256 of every file
    DIR/secrets.npz        s and s_eph, int8 coefficients in {-1, 0, 1} (allow_pickle=False)
    DIR/keys/K.c0.npy      evaluation key K's c0, (limbs, N) uint32, NTT form
    DIR/keys/a_states.npy  (keys, 6) uint64: row i the PCG64 state (:class:`~caramel.ckks.sampling.PcgState`)
                           before the key generator drew c1 = a of the key whose ``a_state`` is i
    DIR/keys/K.c1.npy      c1 of a key without an ``a_state`` (one made from another generator)

Format 2 stores seeded keys: c1 = a is uniform, drawn by the key generator, so the store keeps the
generator's state before that draw (48 bytes) instead of c1's limbs (half of every key) and
:func:`load_keys` draws c1 again (:func:`caramel.ckks.keys.redraw_a`: the same draw, bit for bit; on
the GPU by the PCG64 words of :mod:`caramel.ckks.pcg` when the keys go there). The states file is
digested like every other file. Format 1 (c1 of every key in a file) is still read.

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
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caramel.ckks.keys import PendingKeys, SecretDist, SecretKey, Secrets, key_limbs, redraw_a
from caramel.ckks.keyset import KeySet
from caramel.ckks.sampling import PcgState, lemire_state_rows
from caramel.errors import CaramelError
from caramel.infiles import NotRegularFile, open_regular
from caramel.outfiles import replace_atomically
from caramel.program import EvalKeyId, KeyType

#: ``format`` of the manifest and its version.
FORMAT = "caramel-keys"
VERSION = 2
#: Versions :func:`load_keys` reads (1: every c1 in a file; 2: c1 redrawn from ``a_states``).
READS = (1, 2)
MANIFEST = "manifest.json"
SECRETS = "secrets.npz"
KEYS_DIR = "keys"
A_STATES = f"{KEYS_DIR}/a_states.npy"
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
              program: str | None = None, seeded: bool = True) -> Path:
    """Write ``keyset`` (made for context ``ctx``) to the key store ``directory``; returns its path.

    An existing folder must be empty or a key store (its files are replaced). ``seeded``: a key
    that knows the generator state of its ``a`` (:attr:`~caramel.ckks.keys.EvalKey.a_state`) is
    stored as c0 and that state (module docstring); False, or a key without one, stores c1's limbs."""
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
    states: list[np.ndarray] = []
    for i, (kid, key) in enumerate(keyset.keys.items()):
        entry = {"id": _key_json(kid), "text": str(kid), "limbs": list(key.limbs)}
        halves = [("c0", key.c0)]
        if seeded and getattr(key, "a_state", None) is not None:
            entry["a_state"] = len(states)
            states.append(key.a_state.words())
        else:
            halves.append(("c1", key.c1))
        for half, arr in halves:
            rel = f"{KEYS_DIR}/{i:04d}.{half}.npy"
            files[rel] = _write_atomic(root / rel, _npy_bytes(np.asarray(arr, dtype=np.uint32)))
            entry[half] = rel
        keys.append(entry)
    if states:
        files[A_STATES] = _write_atomic(root / A_STATES, _npy_bytes(np.stack(states)))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "n": int(ctx.n),
        "primes": [int(q) for q in ctx.primes],
        "secrets": {"s": _dist_json(sec.s.dist), "s_eph": _dist_json(sec.s_eph.dist)},
        "key_seed": key_seed,
        "program": program,
        "keys": keys,
        "a_states": A_STATES if states else None,
        "sha256": files,
    }
    _write_atomic(root / MANIFEST, json.dumps(manifest, indent=1).encode())
    return root


# Reading.


def _read_file(root: Path, rel: str, digests: dict[str, str], into=None):
    """The bytes of ``root/rel`` (no symlinks, inside root), checked against the manifest's SHA-256.

    ``into``: a function giving a writable uint8 buffer of a given size (:func:`caramel.backends.cuda.
    transfer.pinned_scratch`); the file is read into it and a memoryview of it returned."""
    if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel not in digests:
        raise KeyStoreError(f"{root / MANIFEST}: bad or undigested file name {rel!r}")
    path = root / rel
    try:
        with open_regular(path, follow=False) as (f, info):
            data = f.read() if into is None else _read_into(f, into(info.st_size), path)
    except NotRegularFile as exc:
        raise KeyStoreError(str(exc)) from None
    except OSError as exc:
        raise KeyStoreError(f"{path}: cannot open ({exc.strerror or exc})") from None
    if hashlib.sha256(data).hexdigest() != digests[rel]:
        raise KeyStoreError(f"{path}: SHA-256 differs from the manifest (file damaged or altered)")
    return data


def _read_into(f, buf: np.ndarray, path: Path) -> memoryview:
    """The whole of file ``f`` read into ``buf`` (its size at open); a file that changed size while
    read is an error."""
    view = memoryview(buf)
    got = 0
    while got < len(view):
        step = f.readinto(view[got:])
        if not step:
            break
        got += step
    if got != len(view) or f.read(1):
        raise KeyStoreError(f"{path}: changed size while read")
    return view


#: Bytes of a .npy header that :func:`_npy_array` reads at most (caramel writes 128).
_NPY_HEADER_MAX = 4096


def _npy_array(data, where: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    try:
        buf = io.BytesIO(bytes(data[:_NPY_HEADER_MAX]))
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
    try:
        arr = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=buf.tell()).reshape(shape)
    except ValueError as exc:
        raise KeyStoreError(f"{where}: array data too short ({exc})") from None
    return arr  # a view of the bytes read


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
    try:
        with open_regular(where, follow=False) as (f, _):
            text = f.read()
    except (NotRegularFile, OSError):
        raise KeyStoreError(f"{root}: not a key store (no {MANIFEST}; make one with `caramel keys`)") from None
    try:
        manifest = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyStoreError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KeyStoreError(f"{where}: not a caramel key store manifest")
    version = manifest.get("version")
    if version not in READS or isinstance(version, bool):
        raise KeyStoreError(f"{where}: format version {version!r}, this caramel reads versions "
                            f"{', '.join(map(str, READS))} (make the store again with `caramel keys`)")
    return manifest


def _a_states(root: Path, manifest: dict, digests: dict[str, str], where: Path) -> np.ndarray | None:
    """The checked (keys, 6) uint64 states file a format-2 manifest names, or None (no seeded key)."""
    rel = manifest.get("a_states")
    if rel is None:
        return None
    if manifest.get("version") < 2:
        raise KeyStoreError(f"{where}: format version {manifest.get('version')} has no a_states")
    data = _read_file(root, rel, digests)
    buf = io.BytesIO(data)
    try:
        arr = np.load(buf, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise KeyStoreError(f"{root / rel}: not a .npy array ({exc})") from None
    if arr.dtype != np.uint64 or arr.ndim != 2 or arr.shape[1] != PcgState.WORDS:
        raise KeyStoreError(f"{root / rel}: array is {arr.dtype} {arr.shape}, expected uint64 (keys, {PcgState.WORDS})")
    return arr


def _a_state(entry: dict, states: np.ndarray | None, kid, where: Path) -> PcgState | None:
    """The :class:`PcgState` of a key entry's ``a_state`` (a row of the states file), None when the
    entry has none (its c1 is a file); KeyStoreError for an entry with neither or a bad state."""
    index = entry.get("a_state")
    if index is None:
        if entry.get("c1") is None:
            raise KeyStoreError(f"{where}: key {kid} has neither a c1 file nor an a_state")
        return None
    if states is None or not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(states):
        raise KeyStoreError(f"{where}: key {kid} has a_state {index!r}, not a row of the states file")
    try:
        return PcgState.from_words(states[index])
    except ValueError as exc:
        raise KeyStoreError(f"{where}: key {kid}: {exc}") from None


def load_keys(directory: str | Path, ctx, *, threads: int | None = None, background: bool = False,
              on_device: bool = False) -> KeySet:
    """Load the key store ``directory`` for context ``ctx`` (N and primes must match); see module docstring.

    ``background``: return once the manifest, the secrets and the states of the keys' ``a`` are read
    and checked; the evaluation keys' files are read on by a thread pool (the key set's ``keys`` is
    a :class:`PendingKeys`), so that they load while the caller encrypts its inputs. ``on_device``:
    each key file is read, checked and copied to the current GPU by its loading thread
    (:func:`_device_load`; for a 1-GPU run, whose executor copies device rows into its arena there),
    and the seeded keys' c1 are drawn again on the GPU by one thread (:func:`_device_redraws`); else
    on the host by the loading threads (:func:`_host_redraw`)."""
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
    states = _a_states(root, manifest, digests, where)
    jobs: list[_Job] = []  # c0 and c1 of every key, in order
    ids = []
    a_states: list[PcgState | None] = []
    for entry in entries:
        kid = _key_id(entry.get("id") if isinstance(entry, dict) else None, where)
        limbs = key_limbs(kid)
        if list(entry.get("limbs", [])) != list(limbs):
            raise KeyStoreError(f"{where}: key {kid} lists limbs {entry.get('limbs')!r}, expected {list(limbs)}")
        ids.append((kid, limbs))
        a_states.append(_a_state(entry, states, kid, where))
        moduli = np.asarray(ctx.moduli(limbs), dtype=np.uint32).reshape(-1, 1)
        jobs += [_Job(entry.get("c0"), limbs, moduli), _Job(a_states[-1] or entry.get("c1"), limbs, moduli)]
    workers = threads or min(16, os.cpu_count() or 1)

    def load(job: _Job):
        if isinstance(job.source, PcgState):
            return _host_redraw(ctx, job.limbs, job.source)
        rel, moduli = job.source, job.moduli
        if on_device:
            return _device_load(root, rel, digests, moduli, n)
        arr = _npy_array(_read_file(root, rel, digests), root / rel, np.uint32, (moduli.shape[0], n))
        if np.any(arr >= moduli):
            raise KeyStoreError(f"{root / rel}: holds residues outside [0, q)")
        return arr

    secrets = _secrets(_read_file(root, SECRETS, digests), root / SECRETS, n, secrets_meta, where)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="caramel-keys")
    seeded = [i for i, job in enumerate(jobs) if on_device and isinstance(job.source, PcgState)]
    futures = [None] * len(jobs)
    for i in sorted(set(range(len(jobs))) - set(seeded)):
        futures[i] = pool.submit(load, jobs[i])
    pool.shutdown(wait=False)  # the threads end when the keys are read
    if seeded:  # on the GPU: every seeded c1 queued at once by one thread of its own
        for i, fut in zip(seeded, _device_redraws(ctx, [(jobs[i].limbs, jobs[i].source) for i in seeded])):
            futures[i] = fut
    pending = PendingKeys(ids, futures, a_states)
    if background:
        return KeySet(secrets, pending)
    try:
        pending.wait()
    except BaseException:
        for f in futures:
            f.cancel()  # a damaged file: the files not yet started are not read
        raise
    return KeySet(secrets, {kid: pending[kid] for kid in pending})


@dataclass(frozen=True, slots=True)
class _Job:
    """One key half to load: ``source`` a file of the store (its name) or the :class:`PcgState` to
    draw c1 from; the key's limbs and their primes (a (k, 1) uint32 column, for the range check)."""

    source: object
    limbs: tuple[int, ...]
    moduli: np.ndarray


_thread_local = threading.local()


def _host_redraw(ctx, limbs, state: PcgState) -> np.ndarray:
    """A seeded key's c1 drawn again on the host (read-only)."""
    arr = redraw_a(ctx, limbs, state)
    arr.setflags(write=False)
    return arr


def _device_xp():
    import cupy

    return cupy


def _device_redraws(ctx, items) -> list[Future]:
    """Futures of the c1 of seeded keys ``items`` ((limbs, :class:`PcgState`) each) drawn again on the
    current GPU, by one thread on a non-blocking stream of its own, once the GPU warm-up
    (:func:`caramel.ckks.device.warm_up`, if started) has finished: every draw is queued without
    waiting (:func:`caramel.ckks.sampling.lemire_state_rows`: PCG64 words and Lemire's test on the
    device), then the thread waits once and reads every draw's failure flag; a draw whose rows left
    their windows (never seen; the flag) is drawn again on the host (:func:`_host_redraw`) and copied
    up. The futures complete together, when every array is ready."""
    futures = [Future() for _ in items]

    def work() -> None:
        try:
            from caramel.ckks.device import wait_for_warm_up

            wait_for_warm_up(log=False)  # its host work (PCG jump-aheads) would slow the warm-up
            xp = _device_xp()
            with _thread_stream():
                drawn = [lemire_state_rows(tuple(ctx.q(l) for l in limbs), ctx.n, st, xp) for limbs, st in items]
                flags = xp.stack([status[0] for _, status in drawn]) if drawn else xp.zeros(0, dtype=np.int64)
                flags = flags.get() if hasattr(flags, "get") else np.asarray(flags)  # waits for every draw
                for fut, (out, _), flag, (limbs, st) in zip(futures, drawn, flags, items):
                    fut.set_result(xp.asarray(_host_redraw(ctx, limbs, st)) if flag else out)
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting caller)
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)

    threading.Thread(target=work, name="caramel-keys-redraw", daemon=True).start()
    return futures


def _device_load(root: Path, rel: str, digests: dict[str, str], moduli: np.ndarray, n: int):
    """Key file ``rel`` as a (k, N) uint32 array on the current GPU: read into the thread's pinned
    buffer (:func:`caramel.backends.cuda.transfer.pinned_scratch`), its SHA-256 checked there, copied
    up (:func:`~caramel.backends.cuda.transfer.upload_pinned`), then its residues checked on the
    device (:func:`~caramel.backends.cuda.transfer.row_maxima` against ``moduli``). A damaged file
    raises :class:`KeyStoreError` and is never handed out. (A loading thread waits for CuPy's import
    and the CUDA context only, not for the rest of :func:`caramel.ckks.device.warm_up`.)"""
    from caramel.backends.cuda import transfer

    k = moduli.shape[0]
    with _thread_stream():
        arr = _npy_array(_read_file(root, rel, digests, into=transfer.pinned_scratch), root / rel, np.uint32, (k, n))
        dev = transfer.upload_pinned(arr)
        maxima = np.asarray(transfer.row_maxima(dev, np.arange(k)))
    if np.any(maxima >= moduli[:, 0]):
        raise KeyStoreError(f"{root / rel}: holds residues outside [0, q)")
    return dev


def _thread_stream():
    """The calling loader thread's non-blocking CUDA stream, as a context (made on first use)."""
    import cupy

    stream = getattr(_thread_local, "stream", None)
    if stream is None:
        stream = _thread_local.stream = cupy.cuda.Stream(non_blocking=True)
    return stream


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
