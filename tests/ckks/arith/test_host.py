"""The host client's batched arithmetic (caramel.ckks.arith.host) against the per-limb formulas, draw for draw.

The reference functions below are the pre-batching implementations (one limb at a time through the
context's NTT, products with ``%``); the batched code must give the same bits for the same draws.
"""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks import Secrets, generate_evalkey
from caramel.ckks.arith import HostArith
from caramel.ckks.encrypt import decrypt, encrypt
from caramel.ckks.keys import extension_modulus, generate_evalkeys, key_limbs, key_secrets
from caramel.ckks.rns import from_residues, mulmod, prime_column, to_ntt
from caramel.ckks.sampling import cbd, uniform_residues

from ckks_helpers import KEY_IDS, context

N = 256


def reference_evalkey(ctx, key_id, secrets, rng):
    """c0, c1 of ISA.md 5.3 computed limb by limb (the pre-batching code path)."""
    limbs = key_limbs(key_id)
    qcol = prime_column(ctx, limbs)
    a = uniform_residues(ctx, limbs, rng)
    e_coeffs = cbd(ctx.n, rng)
    e = np.stack([to_ntt(e_coeffs, ctx, [l])[0] for l in limbs])
    s_old, s_new = key_secrets(ctx, key_id, secrets, limbs)
    big_p = extension_modulus(ctx, key_id.ext)
    p_mod = np.array([big_p % ctx.q(l) if l in key_id.digits else 0 for l in limbs], dtype=np.uint64)[:, None]
    c0 = (qcol - mulmod(a, s_old, qcol) + e.astype(np.uint64) + mulmod(s_new, p_mod, qcol)) % qcol
    return c0.astype(np.uint32), a


@pytest.mark.parametrize("key_id", KEY_IDS, ids=str)
def test_batched_evalkey_equals_per_limb(key_id):
    ctx = context(N)
    sec = Secrets.generate(N, 11)
    want_c0, want_c1 = reference_evalkey(ctx, key_id, sec, np.random.default_rng(5))
    key = generate_evalkey(ctx, key_id, sec, np.random.default_rng(5), device="cpu")
    assert np.array_equal(key.c0, want_c0) and np.array_equal(key.c1, want_c1)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_keys_do_not_depend_on_threads(monkeypatch, threads):
    ctx = context(N)
    sec = Secrets.generate(N, 3)
    monkeypatch.setenv("CARAMEL_CLIENT_THREADS", "1")
    want = generate_evalkeys(ctx, KEY_IDS, sec, 8)
    monkeypatch.setenv("CARAMEL_CLIENT_THREADS", threads)
    got = generate_evalkeys(ctx, KEY_IDS, sec, 8, device=HostArith(chunk_residues=N))  # one row per chunk
    for k in KEY_IDS:
        assert np.array_equal(got[k].c0, want[k].c0) and np.array_equal(got[k].c1, want[k].c1)


def test_generate_evalkeys_equals_one_by_one():
    ctx = context(N)
    sec = Secrets.generate(N, 4)
    rng = np.random.default_rng(9)
    one = {k: generate_evalkey(ctx, k, sec, rng) for k in KEY_IDS}
    many = generate_evalkeys(ctx, KEY_IDS, sec, np.random.default_rng(9))
    assert all(np.array_equal(one[k].c0, many[k].c0) for k in KEY_IDS)


def test_encrypt_equals_per_limb_and_decrypts(rng):
    ctx = context(N)
    sec = Secrets.generate(N, 2)
    limbs = (0, 1, 2, 5)
    coeffs = rng.integers(-(2**40), 2**40, N)
    ct = encrypt(ctx, sec.s, coeffs, limbs, np.random.default_rng(1))
    r = np.random.default_rng(1)
    qcol = prime_column(ctx, limbs)
    a = uniform_residues(ctx, limbs, r)
    m = to_ntt(coeffs, ctx, limbs).astype(np.uint64)
    e = to_ntt(cbd(N, r), ctx, limbs).astype(np.uint64)
    c0 = ((qcol - mulmod(a, sec.s.ntt_limbs(ctx, limbs), qcol)) + m + e) % qcol
    assert np.array_equal(ct.c0, c0.astype(np.uint32)) and np.array_equal(ct.c1, a)
    got = decrypt(ctx, sec.s, ct)
    assert np.max(np.abs((got - coeffs.astype(object)).astype(np.int64))) <= 21


def test_decrypt_equals_per_limb(rng):
    ctx = context(N)
    sec = Secrets.generate(N, 2)
    limbs = (0, 3, 4)
    ct = encrypt(ctx, sec.s, rng.integers(-1000, 1000, N), limbs, rng)
    qcol = prime_column(ctx, limbs)
    m = (ct.c0.astype(np.uint64) + mulmod(ct.c1, sec.s.ntt_limbs(ctx, limbs), qcol)) % qcol
    want = from_residues(np.asarray(ctx.intt(m.astype(np.uint32), list(limbs))), ctx, limbs)
    assert np.array_equal(decrypt(ctx, sec.s, ct), want)


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_plaintext_rows_equal_one_plaintext_at_a_time(monkeypatch, compiled):
    """Several plaintexts' NTT rows at once (limb groups of different lengths, in any order) are the rows of
    each plaintext through the ring's NTT, stacked; the host client's one-plaintext encoding too."""
    from caramel.ckks.arith import HOST
    from caramel.ckks.arith import jit

    if compiled:
        pytest.importorskip("numba")
        monkeypatch.delenv(jit.ENV, raising=False)
        assert jit.enabled()
    else:
        monkeypatch.setenv(jit.ENV, "0")
    ctx = context(N)
    rng = np.random.default_rng(4)
    coeffs = rng.integers(-2**61, 2**61, (3, N))
    coeffs[1, :2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    groups = [(0, 1, 2), (5,), (63, 3, 0, 9)]
    got = HOST.plaintext_rows(coeffs, ctx, groups)
    assert np.array_equal(got, np.concatenate([to_ntt(c, ctx, g) for c, g in zip(coeffs, groups)]))
    assert np.array_equal(HOST.to_ntt_rows(coeffs[2], ctx, groups[2]), to_ntt(coeffs[2], ctx, groups[2]))
    assert HOST.plaintext_rows(coeffs[:0], ctx, []).shape == (0, N)
