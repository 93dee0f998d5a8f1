"""Slot encoding: round trips, generator-5 slot order, rotation = left shift, conjugation."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks import apply_galois, decode, encode, encode_float, rotate_slots, slot_exponents, to_ntt
from caramel.ckks.rns import from_residues

from ckks_helpers import context

NS = [16, 64, 256, 1024, 4096]


def _values(rng, n, real=False):
    v = rng.uniform(-1, 1, n // 2)
    return v if real else v + 1j * rng.uniform(-1, 1, n // 2)


@pytest.mark.parametrize("n", NS, ids=lambda n: f"encode/N={n}")
def test_round_trip(n, rng):
    z = _values(rng, n)
    c = encode(z, 2.0**40, n)
    assert c.dtype == np.int64 and c.shape == (n,)
    assert np.max(np.abs(decode(c, 2.0**40) - z)) < 2**-30


@pytest.mark.parametrize("n", [64, 4096], ids=lambda n: f"encode-real/N={n}")
def test_real_values_give_real_slots(n, rng):
    z = _values(rng, n, real=True)
    out = decode(encode(z, 2.0**30, n), 2.0**30)
    assert np.max(np.abs(out.imag)) < 2**-20 and np.max(np.abs(out.real - z)) < 2**-20


def test_exact_small_case():
    # m(X) = 1 (scale 1) evaluates to 1 in every slot; m(X) = X to zeta^(5^j).
    n = 16
    assert np.allclose(decode(np.eye(n, dtype=np.int64)[0], 1.0), 1)
    zeta_e = np.exp(1j * np.pi * slot_exponents(n) / n)
    assert np.allclose(decode(np.eye(n, dtype=np.int64)[1], 1.0), zeta_e)
    assert list(slot_exponents(n)) == [pow(5, j, 2 * n) for j in range(n // 2)]


@pytest.mark.parametrize("n", [64, 4096], ids=lambda n: f"encode-bigscale/N={n}")
def test_big_scale_object_coefficients(n, rng):
    z = _values(rng, n)
    c = encode(z, 2.0**80, n)
    assert c.dtype == object and all(isinstance(x, int) for x in c[:4])
    assert np.max(np.abs(decode(c, 2.0**80) - z)) < 2**-40
    c56 = encode(z, 2.0**56, n)
    assert np.max(np.abs(decode(c56, 2.0**56) - z)) < 2**-40


def test_scalar_broadcast_and_bad_shape():
    assert np.allclose(decode(encode(0.5, 2.0**30, 32), 2.0**30), 0.5)
    with pytest.raises(ValueError, match=r"expected 16 slot values for N = 32, got shape \(10,\)"):
        encode(np.zeros(10), 2.0**30, 32)
    with pytest.raises(ValueError, match="ring dimension N must be a power of two >= 2, got 48"):
        encode(np.zeros(16), 2.0**30, 48)


def test_decode_garbage_is_inf_not_crash():
    c = np.array([2**3000] + [0] * 15, dtype=object)
    out = decode(c, 2.0**28)
    assert not np.all(np.isfinite(out))


@pytest.mark.parametrize("k", [1, 3, -2, 7, 40], ids=lambda k: f"rotate/k={k}")
def test_positive_rotation_is_left_shift(k, rng):
    n = 64
    z = _values(rng, n)
    g = pow(5, k % (n // 2), 2 * n)
    out = decode(apply_galois(encode(z, 2.0**40, n), g), 2.0**40)
    want = rotate_slots(z, k)
    assert np.max(np.abs(out - want)) < 2**-28
    # slot i receives slot i + k (indices modulo the slot count)
    assert abs(out[0] - z[k % (n // 2)]) < 2**-28
    assert abs(out[5] - z[(5 + k) % (n // 2)]) < 2**-28


def test_conjugation(rng):
    n = 64
    z = _values(rng, n)
    out = decode(apply_galois(encode(z, 2.0**40, n), 2 * n - 1), 2.0**40)
    assert np.max(np.abs(out - np.conj(z))) < 2**-28


@pytest.mark.parametrize("n", [1024, 4096], ids=lambda n: f"rotate-ntt/N={n}")
def test_ring_automorphism_rotates_slots_left(n, rng):
    """The interpreter's NTT-form automorphism with g = galois_element(k) is a left rotation."""
    ctx = context(n)
    z = _values(rng, n)
    limbs = [0, 1]
    a = to_ntt(encode(z, 2.0**30, n), ctx, limbs)
    for k, g, want in [
        (3, ctx.galois_element(3), rotate_slots(z, 3)),
        (-1, ctx.galois_element(-1), rotate_slots(z, -1)),
        (0, ctx.conjugation_element, np.conj(z)),
    ]:
        m = from_residues(ctx.intt(ctx.automorphism(a, g), limbs), ctx, limbs)
        assert np.max(np.abs(decode(m, 2.0**30) - want)) < 2**-20, k


@pytest.mark.parametrize("n", [2, 4, 8, 64, 4096])
def test_the_transform_is_the_dft(n, rng):
    """fft_rows (the encoding's transform, M = N/2 points: none, one and several stages) against NumPy's FFT."""
    from caramel.ckks.encoding import encode_tables, fft_rows

    m = n // 2
    x = rng.standard_normal((3, m)) + 1j * rng.standard_normal((3, m))
    re, im = fft_rows(np.ascontiguousarray(x.real), np.ascontiguousarray(x.imag), encode_tables(n))
    want = np.fft.fft(x, axis=1)
    assert np.max(np.abs(re + 1j * im - want)) <= 1e-14 * np.max(np.abs(want)) * max(1, np.log2(m))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_round_trip_at_the_smallest_rings(n, rng):
    z = _values(rng, n)
    assert np.max(np.abs(decode(encode(z, 2.0**40, n), 2.0**40) - z)) < 2**-30


def test_encode_float_is_unscaled(rng):
    z = _values(rng, 32)
    m = encode_float(z, 32)
    assert m.dtype == np.float64
    assert np.max(np.abs(decode(m, 1.0) - z)) < 1e-12


@pytest.mark.parametrize("n", [16, 1024, 65536], ids=lambda n: f"encode-rows/N={n}")
def test_encode_rows_is_encode_bit_for_bit(n, rng):
    """Complex, real and given vectors at several scales in one call (int64 rows and Python-int rows)."""
    from caramel.ckks.encoding import encode_rows, slot_parts

    half = n // 2
    drawn = rng.uniform(-0.5, 0.5, (3, n))  # [re | im] as draw_inputs draws a complex vector
    real = rng.uniform(-1, 1, half)
    given = [rng.uniform(-2, 2, half) + 1j * rng.uniform(-2, 2, half), 0.25, [0.5 - 1j] * half]
    vectors = [d[:half] + 1j * d[half:] for d in drawn] + [real, *given]
    parts = np.concatenate([drawn, [np.concatenate([real, np.zeros(half)])], [slot_parts(v, n) for v in given]])
    scales = [2.0**40, 2.0**28, 3.7e12, 2.0**30, 2.0**50, 2.0**80, 2.0**61]
    out = np.full((len(vectors), n), -1, dtype=np.int64)
    got = encode_rows(parts, scales, n, out)
    for p, (v, scale) in enumerate(zip(vectors, scales)):
        want = encode(v, scale, n)
        assert got[p].dtype == want.dtype and np.array_equal(got[p], want), p
        if want.dtype == np.int64:
            assert np.shares_memory(got[p], out[p])
    assert got[5].dtype == object and got[0].dtype == np.int64


def test_encode_rows_errors():
    from caramel.ckks.encoding import encode_rows, slot_parts

    assert encode_rows(np.zeros((0, 32)), [], 32) == []
    with pytest.raises(ValueError, match=r"expected rows of 32 slot parts for N = 32, got shape \(2, 16\)"):
        encode_rows(np.zeros((2, 16)), [1.0, 1.0], 32)
    with pytest.raises(ValueError, match="scale must be positive"):
        encode_rows(np.zeros((1, 32)), [0.0], 32)
    with pytest.raises(ValueError, match="cannot encode non-finite values"), np.errstate(invalid="ignore"):
        encode_rows(np.full((1, 32), np.inf), [1.0], 32)
    with pytest.raises(ValueError, match=r"expected 16 slot values for N = 32, got shape \(10,\)"):
        slot_parts(np.zeros(10), 32)


def test_encode_rows_from_consecutive_calls_and_threads(rng):
    """Consecutive calls and calls from several threads at once give encode's bits."""
    from concurrent.futures import ThreadPoolExecutor

    from caramel.ckks.encoding import encode_rows

    n = 1024
    batches = [rng.uniform(-1, 1, (3, n)) for _ in range(8)]
    want = [[encode(p[: n // 2] + 1j * p[n // 2 :], 2.0**40, n) for p in parts] for parts in batches]
    for parts, rows in zip(batches, want):
        assert all(np.array_equal(a, b) for a, b in zip(encode_rows(parts, [2.0**40] * 3, n), rows))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda parts: [r.copy() for r in encode_rows(parts, [2.0**40] * 3, n)], batches * 4))
    assert all(np.array_equal(a, b) for rows, wanted in zip(got, want * 4) for a, b in zip(rows, wanted))
