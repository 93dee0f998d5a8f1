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

Writing (:func:`save_keys`) never touches a file that caramel did not write: the folder must be
new, empty, or a store that caramel wrote (its marker file ``.caramel-keystore`` naming the
manifest's SHA-256, and no file but the ones the manifest lists); anything else is refused. The
new store is written whole into a temporary sibling folder (``.<name>.caramel-keys-<pid>-*``, mode
0700), then renamed into place; an old store is renamed aside first and then deleted file by
file (the files its manifest lists). So an interrupted ``caramel keys`` leaves the old store or
none, never half of one; the temporary folder it leaves is removed by the next ``caramel keys``
into the same folder (once its writer is dead).

Loading checks, before it reads a byte of a file: the store's folders and files belong to this
user and nobody else can write them (the rule of the caches, :mod:`caramel.cache`), every file is
a regular file (no symbolic link) and no larger than what it must hold (a key file: its limbs x N
words; the manifest: :data:`MAX_MANIFEST_BYTES`); then the format, N and primes against the
context, the digest of every file, every array's dtype and shape, and (:func:`require_keys`) that
the store has every key a program needs. It reads files in parallel threads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caramel import cores
from caramel.arrays import to_host
from caramel.ckks.keys import PendingKeys, SecretDist, SecretKey, Secrets, key_limbs, redraw_a
from caramel.ckks.keyset import KeySet
from caramel.ckks.sampling import PcgState, lemire_state_rows
from caramel.errors import CaramelError
from caramel.infiles import BadData, NotRegularFile, TooLarge, npz_arrays, open_regular, parse_json, read_bounded
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
#: The file that marks a folder as a store caramel wrote: the format tag and the manifest's SHA-256.
MARKER = ".caramel-keystore"
#: Largest manifest read (a store of every key of a bootstrapping program needs well under 1 MiB).
MAX_MANIFEST_BYTES = 16 << 20
#: Bytes a .npz of the two secrets may hold beyond their 2 N coefficients (zip and .npy headers).
_SECRETS_SLACK = 64 << 10
_FILE_MODE = 0o600
_DIR_MODE = 0o700
#: Name parts of the temporary folders :func:`save_keys` writes into and renames aside.
_WRITING, _OLD = "caramel-keys", "caramel-old"


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


def _untrusted(st: os.stat_result) -> str | None:
    """Why a store file or folder of status ``st`` must not be trusted (another user's, or writable
    by the group or others: the rule of :func:`caramel.cache._untrusted`), or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by the group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _trusted(path: Path, st: os.stat_result) -> None:
    why = _untrusted(st)
    if why:
        raise KeyStoreError(f"{path}: {why}; a key store must be this user's alone (chmod go-w, or make it "
                            "again with `caramel keys`)")


def _store_files(manifest: dict) -> set[str]:
    """The files (relative names) a store with ``manifest`` holds: the manifest, the marker and
    every file the manifest digests."""
    digests = manifest.get("sha256") if isinstance(manifest, dict) else None
    return {MANIFEST, MARKER} | set(digests if isinstance(digests, dict) else ())


def _listing(root: Path) -> set[str]:
    """Every entry under ``root`` (relative names; folders end in ``/``), never following a link."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out.add(os.path.normpath(os.path.join(rel, d)) + "/")
        for f in filenames:
            out.add(os.path.normpath(os.path.join(rel, f)))
    return out


def _caramel_store(root: Path) -> set[str] | None:
    """The files of ``root`` when it is a store that caramel wrote (its marker names the SHA-256 of
    its manifest, and it holds nothing the manifest does not list), else None."""
    try:
        marker = read_bounded(root / MARKER, 4096, follow=False).decode()
        manifest_bytes = read_bounded(root / MANIFEST, MAX_MANIFEST_BYTES, follow=False)
        manifest = parse_json(manifest_bytes)
    except (OSError, NotRegularFile, TooLarge, BadData, UnicodeDecodeError):
        return None
    if marker.split() != [FORMAT, hashlib.sha256(manifest_bytes).hexdigest()]:
        return None
    files = _store_files(manifest)
    allowed = files | {f"{KEYS_DIR}/"}
    return files if _listing(root) <= allowed else None


def check_target(directory: str | Path) -> str:
    """What :func:`save_keys` will do at ``root``: "new" (absent), "empty" (an empty folder) or
    "replace" (a store caramel wrote); KeyStoreError for anything else, which is never touched."""
    root = Path(directory)
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        if not root.parent.is_dir():
            raise KeyStoreError(f"{root}: the folder {root.parent} does not exist") from None
        return "new"
    if stat.S_ISLNK(st.st_mode):
        raise KeyStoreError(f"{root}: is a symbolic link; a key store must be a real folder")
    if not stat.S_ISDIR(st.st_mode):
        raise KeyStoreError(f"{root}: exists and is not a folder")
    if not os.listdir(root):
        return "empty"  # the folder itself is replaced by the new one
    _trusted(root, st)
    if _caramel_store(root) is None:
        found = sorted(_listing(root))
        raise KeyStoreError(f"{root}: folder is not empty and is no key store that caramel wrote (it holds "
                            f"{', '.join(found[:3])}{' ...' if len(found) > 3 else ''}); refusing to write into "
                            "it: give a new or empty folder")
    return "replace"


def _remove_store(root: Path, files: set[str]) -> None:
    """Delete the store at ``root`` whose files are ``files`` (relative names): those files, the
    keys folder and ``root`` when they are then empty; nothing else."""
    for rel in sorted(files, key=lambda r: -r.count("/")):
        try:
            os.unlink(root / rel)
        except FileNotFoundError:
            pass
    for folder in (root / KEYS_DIR, root):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def _pid_of(name: str, root_name: str) -> int | None:
    """The writer's pid in the name of a temporary sibling ``.<root>.caramel-keys-<pid>-*`` or
    ``.<root>.caramel-old-<pid>-*``, else None."""
    for part in (_WRITING, _OLD):
        head = f".{root_name}.{part}-"
        if name.startswith(head):
            try:
                return int(name[len(head):].split("-", 1)[0])
            except ValueError:
                return None
    return None


def _written_names_only(folder: Path) -> bool:
    """Whether ``folder`` holds only names that :func:`save_keys` writes (a store being written)."""
    ok = {MANIFEST, MARKER, SECRETS, f"{KEYS_DIR}/", A_STATES}
    for rel in _listing(folder):
        name = rel.rsplit("/", 1)[-1]
        if rel in ok or (rel.startswith(f"{KEYS_DIR}/") and rel.count("/") == 1 and
                         (name.endswith((".c0.npy", ".c1.npy")) or name.endswith(".tmp"))) or \
                (rel.count("/") == 0 and name.startswith(".") and name.endswith(".tmp")):
            continue
        return False
    return True


def _remove_stale_siblings(root: Path) -> None:
    """Remove the temporary siblings of ``root`` that an interrupted :func:`save_keys` left: this
    user's, their writer dead, holding only the names a store has."""
    from caramel.cache import _pid_alive

    try:
        names = os.listdir(root.parent)
    except OSError:
        return
    for name in names:
        pid = _pid_of(name, root.name)
        path = root.parent / name
        if pid is None or pid == os.getpid() or _pid_alive(pid):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and _untrusted(st) is None and _written_names_only(path):
            shutil.rmtree(path, ignore_errors=True)


def _dist_json(dist: SecretDist) -> dict:
    return {"name": str(dist), "hamming_weight": dist.hamming_weight}


def _key_json(key_id: EvalKeyId) -> dict:
    return {"type": int(key_id.type), "level": key_id.level, "ext": key_id.ext, "rot": key_id.rot,
            "digits": list(key_id.digits)}


def save_keys(keyset: KeySet, ctx, directory: str | Path, *, key_seed: int | None = None,
              program: str | None = None, seeded: bool = True, progress=None) -> Path:
    """Write ``keyset`` (made for context ``ctx``) to the key store ``directory``; returns its path.

    ``directory`` must be new, an empty folder or a store that caramel wrote (replaced whole);
    anything else is refused before anything is written (module docstring). ``seeded``: a key that
    knows the generator state of its ``a`` (:attr:`~caramel.ckks.keys.EvalKey.a_state`) is stored
    as c0 and that state; False, or a key without one, stores c1's limbs. ``progress``: called
    with the number of files written after each (for a progress bar)."""
    root = Path(directory)
    what = check_target(root)
    _remove_stale_siblings(root)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.{_WRITING}-{os.getpid()}-", dir=root.parent))
    except OSError as exc:
        raise KeyStoreError(f"{root}: cannot write a key store here ({exc.strerror or exc})") from None
    try:
        os.chmod(tmp, _DIR_MODE)
        _write_store(tmp, keyset, ctx, key_seed, program, seeded, progress or (lambda k: None))
        _put_in_place(tmp, root, what)
    except OSError as exc:  # named by the user's folder, never by the temporary one
        shutil.rmtree(tmp, ignore_errors=True)
        raise KeyStoreError(f"{root}: cannot write the key store ({exc.strerror or exc}); nothing was "
                            f"changed there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _put_in_place(tmp: Path, root: Path, what: str) -> None:
    """Rename the finished store ``tmp`` to ``root``: over a missing or empty folder in one rename;
    over an old store (checked again) by renaming it aside, then deleting its files."""
    if what == "replace":
        files = _caramel_store(root)
        if files is None:
            raise KeyStoreError(f"{root}: changed while the keys were written; refusing to replace it")
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.{_OLD}-{os.getpid()}-", dir=root.parent))
        os.rename(root, old / "store")  # aside, in a folder of its own (a rename cannot land on a file)
        os.rename(tmp, root)
        _remove_store(old / "store", files)
        try:
            os.rmdir(old)
        except OSError:
            pass
        return
    try:
        os.rename(tmp, root)  # over nothing, or over an empty folder
    except OSError as exc:
        raise KeyStoreError(f"{root}: could not be put in place ({exc.strerror}); was it filled meanwhile?") from None


def _write_store(root: Path, keyset: KeySet, ctx, key_seed, program, seeded: bool, progress) -> None:
    """Every file of the store into the new folder ``root``; the manifest, then the marker, last."""
    (root / KEYS_DIR).mkdir(mode=_DIR_MODE)
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
        progress(i + 1)
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
    text = json.dumps(manifest, indent=1).encode()
    _write_atomic(root / MANIFEST, text)
    _write_atomic(root / MARKER, f"{FORMAT} {hashlib.sha256(text).hexdigest()}\n".encode())


# Reading.


def _read_file(root: Path, rel: str, digests: dict[str, str], limit: int, into=None):
    """The bytes of ``root/rel`` (no symlinks, inside root, this user's alone, at most ``limit``
    bytes: all checked before a byte is read), checked against the manifest's SHA-256.

    ``into``: a function giving a writable uint8 buffer of a given size (:func:`caramel.backends.cuda.
    transfer.pinned_scratch`); the file is read into it and a memoryview of it returned."""
    if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel not in digests:
        raise KeyStoreError(f"{root / MANIFEST}: bad or undigested file name {rel!r}")
    path = root / rel
    try:
        with open_regular(path, follow=False) as (f, info):
            _trusted(path, info)
            if info.st_size > limit:
                raise KeyStoreError(f"{path}: {info.st_size} bytes, more than the {limit} it can hold; not a file "
                                    "of this store")
            data = f.read(limit + 1) if into is None else _read_into(f, into(info.st_size), path)
            if len(data) > limit:
                raise KeyStoreError(f"{path}: grew while read")
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


def _npy_limit(rows: int, n: int, itemsize: int = 4) -> int:
    """Most bytes a .npy file of a (rows, n) array can hold (its header at most :data:`_NPY_HEADER_MAX`)."""
    return _NPY_HEADER_MAX + rows * n * itemsize


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
    _trusted(root, os.stat(root))
    keys_dir = root / KEYS_DIR
    if keys_dir.is_dir() and not keys_dir.is_symlink():
        _trusted(keys_dir, os.stat(keys_dir))
    where = root / MANIFEST
    try:
        text = read_bounded(where, MAX_MANIFEST_BYTES, follow=False, check=lambda st: _trusted(where, st))
    except TooLarge as exc:
        raise KeyStoreError(f"{where}: {exc.size} bytes, more than any key store's manifest "
                            f"({MAX_MANIFEST_BYTES >> 20} MiB); not a key store") from None
    except (NotRegularFile, OSError):
        raise KeyStoreError(f"{root}: not a key store (no {MANIFEST}; make one with `caramel keys`)") from None
    try:
        manifest = parse_json(text)
    except BadData as exc:
        raise KeyStoreError(f"{where}: not a key store manifest ({exc})") from None
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
    entries = manifest.get("keys")
    rows = len(entries) if isinstance(entries, list) else 0
    data = _read_file(root, rel, digests, _npy_limit(rows, PcgState.WORDS, 8))
    try:
        head = io.BytesIO(bytes(data[:_NPY_HEADER_MAX]))
        major, _ = np.lib.format.read_magic(head)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(head)
    except (ValueError, OSError) as exc:
        raise KeyStoreError(f"{root / rel}: not a .npy array ({exc})") from None
    if dtype != np.uint64 or len(shape) != 2 or shape[1] != PcgState.WORDS or shape[0] > rows:
        raise KeyStoreError(f"{root / rel}: array is {dtype} {tuple(shape)}, expected uint64 (keys, {PcgState.WORDS}) "
                            f"with at most one row per key ({rows})")
    return _npy_array(data, root / rel, np.uint64, (shape[0], PcgState.WORDS))


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
    workers = threads or min(16, cores.available())

    def load(job: _Job):
        if isinstance(job.source, PcgState):
            return _host_redraw(ctx, job.limbs, job.source)
        rel, moduli = job.source, job.moduli
        if on_device:
            return _device_load(root, rel, digests, moduli, n)
        arr = _npy_array(_read_file(root, rel, digests, _npy_limit(moduli.shape[0], n)), root / rel, np.uint32,
                         (moduli.shape[0], n))
        if np.any(arr >= moduli):
            raise KeyStoreError(f"{root / rel}: holds residues outside [0, q)")
        return arr

    secrets = _secrets(_read_file(root, SECRETS, digests, 2 * n + _SECRETS_SLACK), root / SECRETS, n, secrets_meta,
                       where)
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
                flags = to_host(flags)  # waits for every draw
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
        arr = _npy_array(_read_file(root, rel, digests, _npy_limit(k, n), into=transfer.pinned_scratch), root / rel,
                         np.uint32, (k, n))
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
        arrays = npz_arrays(io.BytesIO(data), max_bytes=2 * n, max_members=2)
        s, eph = arrays["s"], arrays["s_eph"]
    except (BadData, TooLarge, KeyError) as exc:
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
