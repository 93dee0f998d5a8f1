"""The key store (caramel.ckks.keystore, `caramel keys`, `--keys`): round trip, permissions, refusals."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

import caramel
from caramel.api import load_keyset
from caramel.ckks.keyset import generate_keyset
from caramel.ckks.keystore import MANIFEST, KeyStoreError, load_keys, save_keys
from caramel.cli import main
from caramel.ring import Context

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
N = 1024


def _key_files(path: Path) -> list[Path]:
    """The store's key files (c0, and c1 of unseeded keys), not the states file."""
    return sorted(p for p in (path / "keys").iterdir() if p.name.endswith((".c0.npy", ".c1.npy")))


def _flip_bit(path: Path, at: int = -1) -> None:
    """Damage ``path``: one bit of its byte ``at`` flipped."""
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def program():
    return caramel.load_program(PROGRAMS / "Mul_4L_2c")


@pytest.fixture(scope="module")
def ctx():
    return Context(n=N)


@pytest.fixture
def store(tmp_path, program, ctx):
    ks = generate_keyset(program, ctx, 9)
    path = save_keys(ks, ctx, tmp_path / "ks", key_seed=9, program=program.name)
    return ks, path


def test_round_trip_and_same_run(store, program, ctx):
    ks, path = store
    back = load_keyset(path, program, ctx)
    assert np.array_equal(back.secrets.s.coeffs, ks.secrets.s.coeffs)
    assert np.array_equal(back.secrets.s_eph.coeffs, ks.secrets.s_eph.coeffs)
    assert back.secrets.describe() == ks.secrets.describe()
    assert set(back.keys) == set(ks.keys)
    for k, key in ks.keys.items():
        assert back.keys[k].limbs == key.limbs
        assert np.array_equal(back.keys[k].c0, key.c0) and np.array_equal(back.keys[k].c1, key.c1)
    a = caramel.run_program(program, ctx=ctx, backend="cpu", seed=1, key_seed=9)
    b = caramel.run_program(program, ctx=ctx, backend="cpu", seed=1, keys=back)
    assert a.digest == b.digest


def test_permissions(store):
    _, path = store
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for f in path.rglob("*"):
        if f.is_file():
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


def test_other_n_or_primes(store):
    _, path = store
    with pytest.raises(KeyStoreError, match="N = 1024"):
        load_keys(path, Context(n=2048))
    primes = list(Context(n=N).primes)
    primes[5], primes[6] = primes[6], primes[5]
    with pytest.raises(KeyStoreError, match="other primes"):
        load_keys(path, Context(n=N, primes=primes))


def test_not_a_store(tmp_path, ctx):
    with pytest.raises(KeyStoreError, match="not a key store"):
        load_keys(tmp_path, ctx)
    with pytest.raises(KeyStoreError, match="no such folder"):
        load_keys(tmp_path / "missing", ctx)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "other"}))
    with pytest.raises(KeyStoreError, match="not a caramel key store"):
        load_keys(tmp_path, ctx)


def test_tampered_file(store, ctx):
    _, path = store
    victim = _key_files(path)[-1]
    _flip_bit(victim)
    with pytest.raises(KeyStoreError, match="SHA-256"):
        load_keys(path, ctx)


def test_symlinked_file_is_refused(store, ctx, tmp_path):
    _, path = store
    victim = _key_files(path)[0]
    copy = tmp_path / "elsewhere.npy"
    copy.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(copy)
    with pytest.raises(KeyStoreError, match="cannot open"):
        load_keys(path, ctx)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("which", ["key", "secrets", "manifest"])
def test_fifo_in_place_of_a_file_is_refused_at_once(store, ctx, which):
    """A FIFO where a store file belongs is a clear error at once, never a hang (before the shared
    non-blocking open of caramel.infiles, a FIFO key file blocked `caramel run --keys` for ever)."""
    _, path = store
    victim = {"key": _key_files(path)[0], "secrets": path / "secrets.npz", "manifest": path / MANIFEST}[which]
    victim.unlink()
    os.mkfifo(victim)
    outcome: list[BaseException] = []

    def load():
        try:
            load_keys(path, ctx)
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread)
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), f"load_keys hangs on a FIFO {which} file"
    assert len(outcome) == 1 and isinstance(outcome[0], KeyStoreError), outcome
    assert ("not a key store" if which == "manifest" else "not a regular file") in str(outcome[0])


def test_store_of_another_program(tmp_path, ctx, program):
    other = caramel.load_program(PROGRAMS / "Add_4L_1c")
    path = save_keys(generate_keyset(other, ctx, 1), ctx, tmp_path / "other")
    if caramel.ckks.requirements(program).keys:
        with pytest.raises(KeyStoreError, match="another program"):
            load_keyset(path, program, ctx)


def test_save_refuses_foreign_folder(tmp_path, store, ctx):
    ks, _ = store
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "notes.txt").write_text("mine")
    with pytest.raises(KeyStoreError, match="not empty"):
        save_keys(ks, ctx, tmp_path / "f")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(KeyStoreError, match="symbolic link"):
        save_keys(ks, ctx, tmp_path / "link")


def test_cli_keys_then_run(tmp_path, capsys):
    out = tmp_path / "ks"
    prog = str(PROGRAMS / "Mul_4L_2c")
    assert main(["keys", prog, "--n", str(N), "--seed", "3", "--out", str(out), "--device", "cpu", "-q"]) == 0
    assert "SECRET KEY" in capsys.readouterr().out
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(out), "--seed", "3", "-q"]) == 0
    with_store = capsys.readouterr().out
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--seed", "3", "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == with_store.splitlines()[1]  # same digest
    assert main(["run", prog, "--n", "2048", "--backend", "cpu", "--keys", str(out), "-q"]) == 2
    assert "N = 1024" in capsys.readouterr().err
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(tmp_path), "-q"]) == 2
    assert "not a key store" in capsys.readouterr().err


def test_background_load_equals_the_load(store, ctx):
    ks, path = store
    now = load_keys(path, ctx)
    later = load_keys(path, ctx, background=True)
    assert set(later.keys) == set(now.keys) and len(later.keys) == len(now.keys)
    assert np.array_equal(later.secrets.s.coeffs, now.secrets.s.coeffs)
    for k in now.keys:
        assert k in later.keys and later.keys[k].limbs == now.keys[k].limbs
        assert np.array_equal(later.keys[k].c0, now.keys[k].c0) and np.array_equal(later.keys[k].c1, now.keys[k].c1)
    later.keys.wait()
    with pytest.raises(KeyError, match="object object at"):  # the id asked for, not some other lookup
        later.keys[object()]


def test_background_load_of_a_tampered_file_fails_when_read(store, ctx):
    _, path = store
    victim = _key_files(path)[-1]
    _flip_bit(victim)
    keyset = load_keys(path, ctx, background=True)  # the ids and secrets are fine
    with pytest.raises(KeyStoreError, match="SHA-256"):
        keyset.keys.wait()
    with pytest.raises(KeyStoreError, match="SHA-256"):
        [keyset.keys[k] for k in keyset.keys]


@pytest.mark.parametrize("batch", [[], ["--batch", "2"]], ids=["run", "batch"])
@pytest.mark.parametrize("victim", [0, -1], ids=["first-key", "last-key"])
def test_cli_run_with_a_tampered_key_file_fails(tmp_path, capsys, batch, victim):
    out = tmp_path / "ks"
    prog = str(PROGRAMS / "Mul_4L_2c")
    assert main(["keys", prog, "--n", str(N), "--seed", "3", "--out", str(out), "--device", "cpu", "-q"]) == 0
    _flip_bit(_key_files(out)[victim])
    capsys.readouterr()
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(out), "--seed", "3", "-q",
                 *batch]) == 2
    assert "SHA-256 differs" in capsys.readouterr().err


class _Copied(np.ndarray):
    """A host array standing for a device copy (CPU tests of the ``on_device`` path)."""


@pytest.fixture
def fake_device(monkeypatch):
    """``on_device`` loading on the host: pinned buffers are NumPy buffers, the upload a tagged copy,
    the device's row maxima NumPy's, the device redraws those of NumPy (the reference of the kernels),
    tagged. Returns the list of files read into a buffer."""
    import contextlib

    from caramel.backends.cuda import transfer
    from caramel.ckks import keystore

    read = []

    def scratch(nbytes):
        read.append(nbytes)
        return np.empty(nbytes, dtype=np.uint8)

    monkeypatch.setattr(transfer, "pinned_scratch", scratch)
    monkeypatch.setattr(transfer, "upload_pinned", lambda a: np.array(a).view(_Copied))
    monkeypatch.setattr(transfer, "row_maxima", lambda arena, rows: np.asarray(arena)[rows].max(axis=1))
    monkeypatch.setattr(keystore, "_thread_stream", contextlib.nullcontext)
    monkeypatch.setattr(keystore, "_device_xp", lambda: np)
    draw = keystore.lemire_state_rows

    def tagged(qs, n, st, xp):
        out, failed = draw(qs, n, st, xp)
        return out.view(_Copied), failed

    monkeypatch.setattr(keystore, "lemire_state_rows", tagged)
    return read


def test_keys_copied_to_the_device_by_the_loading_threads(many, fake_device, tmp_path):
    """``on_device``: every key file is read into a (pinned) buffer, its digest checked, copied up and
    its residues checked there; every seeded c1 drawn by ``_device_redraw``; unseeded c1 files go
    the same way as c0. A tampered file still fails."""
    import shutil

    ks, path, c = many
    full = save_keys(ks, c, tmp_path / "full", seeded=False)
    for store in (path, full):
        for background in (False, True):
            fake_device.clear()
            got = load_keys(store, c, background=background, on_device=True)
            for k, key in ks.keys.items():
                assert isinstance(got.keys[k].c0, _Copied) and isinstance(got.keys[k].c1, _Copied)
                assert np.array_equal(got.keys[k].c0, key.c0) and np.array_equal(got.keys[k].c1, key.c1)
            assert len(fake_device) == len(ks.keys) * (1 if store == path else 2)
    copy = shutil.copytree(path, tmp_path / "bad")
    victim = _key_files(copy)[-1]
    _flip_bit(victim)
    with pytest.raises(KeyStoreError, match="SHA-256"):
        load_keys(copy, c, background=True, on_device=True).keys.wait()


@pytest.mark.parametrize("on_device", [False, True])
def test_residue_out_of_range_is_refused(many, fake_device, tmp_path, on_device):
    """A key file whose digest matches (rewritten with its digest) but holds a residue >= q is
    refused, on the host and (after the copy) on the device."""
    import hashlib
    import shutil

    _, path, c = many
    copy = shutil.copytree(path, tmp_path / "ks")
    victim = _key_files(copy)[0]
    arr = np.load(victim)
    arr[1, 7] = 2**31 + 5
    np.save(victim, arr, allow_pickle=False)
    rel = f"keys/{victim.name}"
    _rewrite_manifest(copy, lambda m: m["sha256"].__setitem__(rel, hashlib.sha256(victim.read_bytes()).hexdigest()))
    with pytest.raises(KeyStoreError, match="outside"):
        load_keys(copy, c, on_device=on_device)


def test_a_file_shorter_than_its_header_says_is_refused(many, tmp_path):
    import hashlib
    import shutil

    _, path, c = many
    copy = shutil.copytree(path, tmp_path / "ks")
    victim = _key_files(copy)[0]
    victim.write_bytes(victim.read_bytes()[:-8])
    rel = f"keys/{victim.name}"
    _rewrite_manifest(copy, lambda m: m["sha256"].__setitem__(rel, hashlib.sha256(victim.read_bytes()).hexdigest()))
    with pytest.raises(KeyStoreError, match="too short"):
        load_keys(copy, c)


@pytest.mark.skipif(not caramel.api.gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_keys_loaded_onto_the_gpu_equal_the_host_keys(store, ctx):
    ks, path = store
    now = load_keys(path, ctx)
    got = load_keys(path, ctx, background=True, on_device=True)
    for k in now.keys:
        assert not isinstance(got.keys[k].c0, np.ndarray)
        assert np.array_equal(got.keys[k].c0.get(), now.keys[k].c0) and np.array_equal(got.keys[k].c1.get(), now.keys[k].c1)


# Format 2: seeded keys (c0 and the generator state of c1 = a).


def _rewrite_manifest(path: Path, change) -> None:
    m = json.loads((path / MANIFEST).read_text())
    change(m)
    (path / MANIFEST).write_text(json.dumps(m))


def _keys_equal(got, want) -> None:
    assert set(got.keys) == set(want.keys)
    for k, key in want.keys.items():
        assert got.keys[k].limbs == key.limbs
        assert np.array_equal(got.keys[k].c0, key.c0) and np.array_equal(got.keys[k].c1, key.c1), k


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A key set of several keys (rotations, conjugation, bootstrap) and its seeded store."""
    prog = caramel.load_program(PROGRAMS / "BootstrapModRaise_4L_2c")
    c = Context(n=N)
    ks = generate_keyset(prog, c, 4)
    return ks, save_keys(ks, c, tmp_path_factory.mktemp("many") / "ks", key_seed=4, program=prog.name), c


def test_seeded_store_holds_c0_and_states_only(many):
    from caramel.ckks.keystore import A_STATES, VERSION

    ks, path, c = many
    names = sorted(p.name for p in (path / "keys").iterdir())
    assert len(ks.keys) > 1 and names == sorted([f"{i:04d}.c0.npy" for i in range(len(ks.keys))] + ["a_states.npy"])
    m = json.loads((path / MANIFEST).read_text())
    assert m["version"] == VERSION == 2 and m["a_states"] == A_STATES and A_STATES in m["sha256"]
    assert sorted(e["a_state"] for e in m["keys"]) == list(range(len(ks.keys)))
    back = load_keys(path, c)
    _keys_equal(back, ks)  # c1 drawn again equals the generated c1, limb for limb
    assert all(back.keys[k].a_state == key.a_state for k, key in ks.keys.items())
    # the same keys generated afresh from the key seed
    _keys_equal(back, generate_keyset(caramel.load_program(PROGRAMS / "BootstrapModRaise_4L_2c"), c, 4))


def test_unseeded_and_format_1_stores_still_load(many, tmp_path):
    ks, _, c = many
    path = save_keys(ks, c, tmp_path / "full", seeded=False)
    assert len(list((path / "keys").glob("*.c1.npy"))) == len(ks.keys)
    _keys_equal(load_keys(path, c), ks)

    def to_v1(m):
        m["version"] = 1
        del m["a_states"]

    _rewrite_manifest(path, to_v1)  # what format 1 wrote
    _keys_equal(load_keys(path, c), ks)
    assert all(k.a_state is None for k in load_keys(path, c).keys.values())


def test_resaving_a_loaded_store_keeps_it_seeded(many, tmp_path):
    ks, path, c = many
    again = save_keys(load_keys(path, c), c, tmp_path / "again")
    assert not list((again / "keys").glob("*.c1.npy"))
    _keys_equal(load_keys(again, c), ks)


def test_key_without_a_state_keeps_its_c1_file(tmp_path, ctx):
    """A key from a generator other than PCG64 has no state: its c1 is stored as limbs."""
    from caramel.ckks.keys import Secrets, generate_evalkey
    from caramel.ckks.keyset import KeySet
    from caramel.program import EvalKeyId, KeyType

    rng = np.random.Generator(np.random.Philox(2))
    sec = Secrets.generate(N, rng)
    kid = EvalKeyId(KeyType.RELIN, 3, 2, 0, (0, 2))
    ks = KeySet(sec, {kid: generate_evalkey(ctx, kid, sec, rng)})
    path = save_keys(ks, ctx, tmp_path / "philox")
    assert json.loads((path / MANIFEST).read_text())["a_states"] is None
    _keys_equal(load_keys(path, ctx), ks)


@pytest.mark.parametrize("background", [False, True])
def test_tampered_states_file_fails_at_once(many, tmp_path, background):
    import shutil

    _, path, c = many
    copy = shutil.copytree(path, tmp_path / "ks")
    victim = copy / "keys" / "a_states.npy"
    _flip_bit(victim, -3)
    with pytest.raises(KeyStoreError, match="a_states.npy: SHA-256 differs"):
        load_keys(copy, c, background=background)


def _states_rewritten(path: Path, change) -> None:
    """Rewrite the states file through ``change`` (and its digest, as a forger would)."""
    import hashlib
    import io

    arr = np.load(path / "keys" / "a_states.npy")
    arr = change(arr)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    (path / "keys" / "a_states.npy").write_bytes(buf.getvalue())
    _rewrite_manifest(path, lambda m: m["sha256"].__setitem__("keys/a_states.npy", hashlib.sha256(buf.getvalue()).hexdigest()))


@pytest.mark.parametrize("case, change, message", [
    ("even inc", lambda a: (a.__setitem__((0, 3), a[0, 3] ^ np.uint64(1)), a)[1], "not a PCG64 state"),
    ("wrong width", lambda a: a[:, :5].copy(), r"expected uint64 \(keys, 6\)"),
    ("wrong dtype", lambda a: a.astype(np.int64), r"expected uint64"),
    ("too few rows", lambda a: a[:1].copy(), "not a row of the states file"),
])
def test_bad_states_are_clear_errors(many, tmp_path, case, change, message):
    import shutil

    _, path, c = many
    copy = shutil.copytree(path, tmp_path / "ks")
    _states_rewritten(copy, change)
    with pytest.raises(KeyStoreError, match=message):
        load_keys(copy, c)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.__setitem__("version", 3), "reads versions 1, 2"),
    (lambda m: m.__setitem__("version", 1), "format version 1 has no a_states"),
    (lambda m: m["keys"][0].__setitem__("a_state", None), "neither a c1 file nor an a_state"),
    (lambda m: m["keys"][0].__setitem__("a_state", "0"), "not a row of the states file"),
    (lambda m: m.__setitem__("a_states", "keys/../../x.npy"), "bad or undigested file name"),
])
def test_bad_format_2_manifests_are_clear_errors(many, tmp_path, change, message):
    import shutil

    _, path, c = many
    copy = shutil.copytree(path, tmp_path / "ks")
    _rewrite_manifest(copy, change)
    with pytest.raises(KeyStoreError, match=message):
        load_keys(copy, c)


def test_cli_run_with_a_tampered_states_file_exits_2(tmp_path, capsys):
    out = tmp_path / "ks"
    prog = str(PROGRAMS / "Mul_4L_2c")
    assert main(["keys", prog, "--n", str(N), "--seed", "3", "--out", str(out), "--device", "cpu", "-q"]) == 0
    victim = out / "keys" / "a_states.npy"
    _flip_bit(victim)
    capsys.readouterr()
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(out), "--seed", "3", "-q"]) == 2
    assert "SHA-256 differs" in capsys.readouterr().err


@pytest.mark.skipif(not caramel.api.gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_seeded_keys_drawn_again_on_the_gpu_equal_the_generated_keys(many):
    """``on_device``: c1 of every seeded key is drawn on the GPU (PCG64 words there), limb for limb
    the generated c1; c0 copied up unchanged."""
    ks, path, c = many
    for background in (True, False):
        got = load_keys(path, c, background=background, on_device=True)
        for k, key in ks.keys.items():
            assert not isinstance(got.keys[k].c1, np.ndarray)
            assert np.array_equal(got.keys[k].c1.get(), key.c1) and np.array_equal(got.keys[k].c0.get(), key.c0), k


def test_a_device_redraw_that_left_its_window_is_drawn_on_the_host(many, fake_device, monkeypatch):
    from caramel.ckks import keystore

    ks, path, c = many
    calls = []

    def failing(qs, n, st, xp):
        calls.append(len(qs))
        return np.zeros((len(qs), n), dtype=np.uint32), np.array([1, 0], dtype=np.int64)

    monkeypatch.setattr(keystore, "lemire_state_rows", failing)
    got = load_keys(path, c, background=True, on_device=True)
    _keys_equal(got, ks)
    assert len(calls) == len(ks.keys)


def test_a_device_redraw_error_reaches_the_caller(many, fake_device, monkeypatch):
    from caramel.ckks import keystore

    _, path, c = many

    def broken(qs, n, st, xp):
        raise RuntimeError("device gone")

    monkeypatch.setattr(keystore, "lemire_state_rows", broken)
    got = load_keys(path, c, background=True, on_device=True)
    with pytest.raises(RuntimeError, match="device gone"):
        got.keys.wait()


def test_device_redraws_start_after_the_gpu_warm_up(monkeypatch):
    """The c1 thread of a GPU load waits for the warm-up's thread before its first GPU work (its host
    PCG jump-aheads would slow the warm-up down); an error after that reaches every future."""
    import threading

    from caramel.ckks import device as devmod
    from caramel.ckks import keystore as ks

    go = threading.Event()
    warm = threading.Thread(target=go.wait)
    warm.start()
    monkeypatch.setattr(devmod, "_warm_up", warm)
    reached = threading.Event()

    def no_gpu():
        reached.set()
        raise RuntimeError("no GPU here")
    monkeypatch.setattr(ks, "_device_xp", no_gpu)
    futures = ks._device_redraws(Context(n=1024), [((0,), None), ((1,), None)])
    assert not reached.wait(0.2) and not any(f.done() for f in futures)  # still waiting for the warm-up
    go.set()
    for fut in futures:
        with pytest.raises(RuntimeError, match="no GPU here"):
            fut.result(timeout=30)
    assert reached.is_set()


# Writing only into what caramel wrote; interrupted writes; trust and bounds when reading.


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> bytes), links as their target's text."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"<dir>"
    return out


def test_save_never_touches_a_folder_caramel_did_not_write(tmp_path, store, ctx):
    """A folder holding a manifest.json of the right format is no store of caramel's without its
    marker: before, its keys/*.npy were deleted and the manifest replaced, exit 0."""
    ks, _ = store
    planted = tmp_path / "mine"
    (planted / "keys").mkdir(parents=True)
    (planted / MANIFEST).write_text(json.dumps({"format": "caramel-keys", "version": 2}))
    (planted / "keys" / "results.npy").write_bytes(b"precious")
    before = _tree(planted)
    with pytest.raises(KeyStoreError, match="no key store that caramel wrote"):
        save_keys(ks, ctx, planted)
    assert _tree(planted) == before


def test_save_refuses_a_store_holding_a_file_it_did_not_write(store, ctx):
    ks, path = store
    (path / "keys" / "notes.txt").write_text("mine")
    before = _tree(path)
    with pytest.raises(KeyStoreError, match="no key store that caramel wrote"):
        save_keys(ks, ctx, path)
    assert _tree(path) == before


def test_resave_replaces_every_file_with_the_new_store(store, program, ctx):
    """A store saved over another holds the new keys and none of the old files."""
    _, path = store
    other = generate_keyset(program, ctx, 10)
    save_keys(other, ctx, path, key_seed=10)
    back = load_keys(path, ctx)
    _keys_equal(back, other)
    assert json.loads((path / MANIFEST).read_text())["key_seed"] == 10
    fresh = save_keys(other, ctx, path.parent / "fresh", key_seed=10)
    assert set(_tree(path)) == set(_tree(fresh))
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupted_save_leaves_the_old_store_or_none(store, program, ctx, monkeypatch, existing):
    """Ctrl-C in the middle of writing: the folder holds the old store whole (or nothing), no
    temporary folder is left, and the next save works."""
    import caramel.ckks.keystore as keystore

    ks, path = store
    target = path if existing else path.parent / "new"
    before = _tree(target) if existing else None
    real, calls = keystore._write_atomic, []

    def interrupted(p, data):
        calls.append(p)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(p, data)

    monkeypatch.setattr(keystore, "_write_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_keys(generate_keyset(program, ctx, 11), ctx, target, key_seed=11)
    monkeypatch.setattr(keystore, "_write_atomic", real)
    assert (_tree(target) == before) if existing else not target.exists()
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".")] == []
    save_keys(ks, ctx, target, key_seed=9)
    _keys_equal(load_keys(target, ctx), ks)


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_save_leaves_a_folder_the_next_save_removes(store, ctx):
    """``kill -9`` in the middle of writing leaves a temporary sibling: the next save into the same
    folder removes it when its writer is dead and it holds only a store's files, else leaves it."""
    ks, path = store
    dead = path.parent / f".{path.name}.caramel-keys-{_dead_pid()}-x1"
    (dead / "keys").mkdir(parents=True)
    (dead / "secrets.npz").write_bytes(b"half")
    (dead / "keys" / "0000.c0.npy").write_bytes(b"half")
    alive = path.parent / f".{path.name}.caramel-keys-{os.getppid()}-x2"
    alive.mkdir()
    foreign = path.parent / f".{path.name}.caramel-keys-{_dead_pid()}-x3"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    save_keys(ks, ctx, path, key_seed=9)
    assert not dead.exists() and alive.exists() and (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["folder", "keys folder", "manifest", "key file"])
def test_a_store_others_can_write_is_refused(store, ctx, where):
    """The caches' trust rule: a store the group or others can write is refused (it was used)."""
    _, path = store
    victim = {"folder": path, "keys folder": path / "keys", "manifest": path / MANIFEST,
              "key file": _key_files(path)[0]}[where]
    victim.chmod(stat.S_IMODE(victim.stat().st_mode) | 0o002)
    with pytest.raises(KeyStoreError, match="can be written by the group or others"):
        load_keys(path, ctx)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
@pytest.mark.parametrize("where", ["folder", "manifest", "secrets"])
def test_a_store_of_another_user_is_refused(store, ctx, where):
    _, path = store
    victim = {"folder": path, "manifest": path / MANIFEST, "secrets": path / "secrets.npz"}[where]
    os.chown(victim, 65534, 65534)
    with pytest.raises(KeyStoreError, match="belongs to another user"):
        load_keys(path, ctx)


@pytest.mark.parametrize("which,message", [("manifest", "more than any key store's manifest"),
                                           ("key", "more than the"), ("secrets", "more than the")])
def test_huge_sparse_files_are_refused_before_any_read(store, ctx, which, message):
    """A 5 GiB sparse file (no disk, all of it memory if read) is refused from its size alone."""
    _, path = store
    victim = {"key": _key_files(path)[0], "secrets": path / "secrets.npz", "manifest": path / MANIFEST}[which]
    os.truncate(victim, 5 << 30)
    with pytest.raises(KeyStoreError, match=message):
        load_keys(path, ctx)


def test_a_deeply_nested_manifest_is_a_clear_error(store, ctx):
    _, path = store
    (path / MANIFEST).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(KeyStoreError, match="nested more than"):
        load_keys(path, ctx)


def test_cli_keys_refuses_a_foreign_folder_before_any_work(tmp_path, capsys, monkeypatch):
    import caramel.cli as cli

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("work started"))
    assert main(["keys", str(PROGRAMS / "Mul_4L_2c"), "--out", str(tmp_path / "mine"), "-q"]) == 2
    assert "no key store that caramel wrote" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_cli_run_reports_the_stores_key_seed_and_refuses_another(tmp_path, capsys):
    """With --keys the record says the store's key seed (it used to say --seed's), and a
    --key-seed that disagrees is refused (it used to be ignored)."""
    out = tmp_path / "ks"
    prog = str(PROGRAMS / "Mul_4L_2c")
    assert main(["keys", prog, "--n", str(N), "--seed", "7", "--out", str(out), "--device", "cpu", "-q"]) == 0
    capsys.readouterr()
    base = ["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(out), "--seed", "3", "-q"]
    assert main([*base, "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["key_seed"] == 7
    assert main([*base, "--key-seed", "7"]) == 0
    capsys.readouterr()
    assert main([*base, "--key-seed", "3"]) == 2
    assert "records key seed 7" in capsys.readouterr().err
    assert main([*base, "--batch", "2", "--json", str(tmp_path / "b.json")]) == 0
    assert "key seed 7 (key store" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["key_seed"] == 7


def test_a_failed_write_names_the_store_not_a_temporary_file(store, program, ctx, monkeypatch):
    import errno

    import caramel.ckks.keystore as keystore

    ks, path = store
    before = _tree(path)

    def full(p, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(p) + ".abc.tmp")

    monkeypatch.setattr(keystore, "replace_atomically", full)
    with pytest.raises(KeyStoreError, match="No space left on device") as exc:
        save_keys(generate_keyset(program, ctx, 12), ctx, path)
    assert str(path) in str(exc.value) and ".tmp" not in str(exc.value) and "caramel-keys-" not in str(exc.value)
    assert _tree(path) == before and [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []
