"""The key store (caramel.ckks.keystore, `caramel keys`, `--keys`): round trip, permissions, refusals."""

from __future__ import annotations

import json
import os
import stat
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
    victim = sorted((path / "keys").iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(KeyStoreError, match="SHA-256"):
        load_keys(path, ctx)


def test_symlinked_file_is_refused(store, ctx, tmp_path):
    _, path = store
    victim = sorted((path / "keys").iterdir())[0]
    copy = tmp_path / "elsewhere.npy"
    copy.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(copy)
    with pytest.raises(KeyStoreError, match="cannot open"):
        load_keys(path, ctx)


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


def test_resave_replaces(store, ctx):
    ks, path = store
    save_keys(ks, ctx, path)
    assert len(load_keys(path, ctx).keys) == len(ks.keys)


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
    with pytest.raises(KeyError):
        later.keys[object()]


def test_background_load_of_a_tampered_file_fails_when_read(store, ctx):
    _, path = store
    victim = sorted((path / "keys").iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    keyset = load_keys(path, ctx, background=True)  # the ids and secrets are fine
    with pytest.raises(KeyStoreError, match="SHA-256"):
        keyset.keys.wait()
    with pytest.raises(KeyStoreError, match="SHA-256"):
        [keyset.keys[k] for k in keyset.keys]


def test_cli_run_with_a_tampered_key_file_fails(tmp_path, capsys):
    out = tmp_path / "ks"
    prog = str(PROGRAMS / "Mul_4L_2c")
    assert main(["keys", prog, "--n", str(N), "--seed", "3", "--out", str(out), "--device", "cpu", "-q"]) == 0
    victim = sorted((out / "keys").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["run", prog, "--n", str(N), "--backend", "cpu", "--keys", str(out), "--seed", "3", "-q"]) == 2
    assert "SHA-256 differs" in capsys.readouterr().err


def test_keys_copied_to_the_device_by_the_loading_threads(store, ctx, monkeypatch):
    """``on_device``: every key half is handed to ``_device_copy`` after its digest and range checks
    (faked here: a tagged copy); a tampered file still fails, and is never copied."""
    from caramel.ckks import keystore

    class Copied(np.ndarray):
        pass

    monkeypatch.setattr(keystore, "_device_copy", lambda a: np.array(a).view(Copied))
    ks, path = store
    now = load_keys(path, ctx)
    for background in (False, True):
        got = load_keys(path, ctx, background=background, on_device=True)
        for k in now.keys:
            assert isinstance(got.keys[k].c0, Copied) and isinstance(got.keys[k].c1, Copied)
            assert np.array_equal(got.keys[k].c0, now.keys[k].c0) and np.array_equal(got.keys[k].c1, now.keys[k].c1)
    victim = sorted((path / "keys").iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(KeyStoreError, match="SHA-256"):
        load_keys(path, ctx, background=True, on_device=True).keys.wait()


@pytest.mark.skipif(not caramel.api.gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_keys_loaded_onto_the_gpu_equal_the_host_keys(store, ctx):
    ks, path = store
    now = load_keys(path, ctx)
    got = load_keys(path, ctx, background=True, on_device=True)
    for k in now.keys:
        assert not isinstance(got.keys[k].c0, np.ndarray)
        assert np.array_equal(got.keys[k].c0.get(), now.keys[k].c0) and np.array_equal(got.keys[k].c1.get(), now.keys[k].c1)
