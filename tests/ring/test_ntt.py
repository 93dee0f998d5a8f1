"""ntt: tables against the known roots, kernels against a direct O(N^2) negacyclic DFT with Python ints."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ring import PRIMES, NttTable, bit_reverse, intt, ntt, primitive_root_2n


def direct_ntt(a, q: int, psi: int) -> list[int]:
    """A[j] = sum_i a_i psi^((2 br(j)+1) i) mod q, with Python ints."""
    n = len(a)
    log_n = n.bit_length() - 1
    out = []
    for j in range(n):
        brj = int(format(j, f"0{log_n}b")[::-1], 2) if log_n else 0
        root = pow(psi, 2 * brj + 1, q)
        acc, power = 0, 1
        for coef in a:
            acc += int(coef) * power
            power = power * root % q
        out.append(acc % q)
    return out


def direct_intt(values, q: int, psi: int) -> list[int]:
    """a_i = N^-1 sum_j A[j] psi^(-(2 br(j)+1) i) mod q."""
    n = len(values)
    log_n = n.bit_length() - 1
    n_inv = pow(n, -1, q)
    psi_inv = pow(psi, -1, q)
    out = []
    for i in range(n):
        acc = 0
        for j, v in enumerate(values):
            brj = int(format(j, f"0{log_n}b")[::-1], 2)
            acc += int(v) * pow(psi_inv, (2 * brj + 1) * i, q)
        out.append(acc * n_inv % q)
    return out


def negacyclic_product(a, b, q: int) -> list[int]:
    n = len(a)
    out = [0] * n
    for i in range(n):
        for j in range(n):
            k = i + j
            if k < n:
                out[k] += int(a[i]) * int(b[j])
            else:
                out[k - n] -= int(a[i]) * int(b[j])
    return [v % q for v in out]


@pytest.mark.parametrize(
    "n,limb,psi",
    [
        pytest.param(n, limb, psi, id=f"psi/N={n}/limb={limb}")
        for n, limb, psi in [(1024, 0, 174667), (1024, 1, 109122), (1024, 63, 312668),
                             (65536, 0, 1496), (65536, 1, 858), (65536, 63, 5274)]
    ],
)
def test_known_psi(n, limb, psi):
    have = NttTable(PRIMES[limb], n).psi
    assert have == psi, f"psi/N={n}/limb={limb}: want {psi}, have {have}"


def test_psi_is_smallest_primitive_root():
    q, n = PRIMES[1], 1024
    psi = primitive_root_2n(q, n)
    assert pow(psi, n, q) == q - 1 and pow(psi, 2 * n, q) == 1
    smaller = [g for g in range(2, psi) if pow(g, n, q) == q - 1]
    assert smaller == [], f"want no root below {psi}, have {smaller[:5]}"


def test_primitive_root_requires_q_1_mod_2n():
    with pytest.raises(ValueError, match="not 1 mod 2N"):
        primitive_root_2n(97, 64)


def test_bit_reverse():
    assert bit_reverse(8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reverse(1).tolist() == [0]
    assert bit_reverse(8) is bit_reverse(8) and not bit_reverse(8).flags.writeable  # cached, shared read-only


def test_table_powers():
    t = NttTable(PRIMES[5], 64)
    br = bit_reverse(64)
    want = [pow(t.psi, int(b), t.q) for b in br]
    assert t.psi_powers.tolist() == want
    assert t.psi_inv_powers.tolist() == [pow(t.psi_inv, int(b), t.q) for b in br]
    assert t.n_inv * 64 % t.q == 1 and t.psi * t.psi_inv % t.q == 1


@pytest.mark.parametrize("n, limb", [(64, 5), (1024, 0), (65536, 63)])
def test_tables_equal_the_formulas(n, limb):
    """Powers gathered from the root's powers and the host kernel tables (built on first use) equal
    the powers of psi by Python's pow, the least odd power psi, and the kernel layout and Shoup
    quotients computed from them directly."""
    from caramel.ring.ntt import _kernel_layout, _split

    q = PRIMES[limb]
    t = NttTable(q, n)
    r = next(pow(x, (q - 1) // (2 * n), q) for x in range(2, 1000) if pow(pow(x, (q - 1) // (2 * n), q), n, q) == q - 1)
    assert t.psi == min(pow(r, 2 * j + 1, q) for j in range(n)) if n <= 1024 else pow(t.psi, n, q) == q - 1
    br = bit_reverse(n)
    pick = np.random.default_rng(n).integers(0, n, size=200)
    assert [int(t.psi_powers[i]) for i in pick] == [pow(t.psi, int(br[i]), q) for i in pick]
    assert [int(t.psi_inv_powers[i]) for i in pick] == [pow(t.psi_inv, int(br[i]), q) for i in pick]
    for name, w in (("_fw", t.psi_powers), ("_iw", t.psi_inv_powers)):
        lay = _kernel_layout(w.astype(np.uint64), n, _split(n.bit_length() - 1))
        assert np.array_equal(getattr(t, name), lay) and not getattr(t, name).flags.writeable
        assert np.array_equal(getattr(t, name + "p"), [(int(x) << 32) // q for x in lay])
        assert getattr(t, name) is getattr(t, name)  # built once


@pytest.mark.parametrize(
    "n,limbs",
    [
        pytest.param(n, limbs, id=f"ntt/N={n}/limbs={len(limbs)}")
        for n in (2, 4, 8, 16, 64)
        for limbs in ((0,), (1, 30, 63))
    ],
)
def test_ntt_against_direct_dft(n, limbs, rng, expect_equal, residues):
    tables = [NttTable(PRIMES[l], n) for l in limbs]
    a = residues(rng, [t.q for t in tables], n)
    have = ntt(a, tables)
    want = np.array([direct_ntt(a[r], t.q, t.psi) for r, t in enumerate(tables)], dtype=np.uint32)
    assert have.dtype == np.uint32
    expect_equal(have, want, f"ntt/N={n}/limbs={len(limbs)}")
    back = intt(have, tables)
    expect_equal(back, a, f"intt/N={n}/limbs={len(limbs)}")


@pytest.mark.parametrize("n", [16, 32], ids=lambda n: f"intt/N={n}")
def test_intt_against_direct_formula(n, rng, expect_equal):
    t = NttTable(PRIMES[7], n)
    values = rng.integers(0, t.q, n, dtype=np.uint64)
    expect_equal(intt(values, t), np.array(direct_intt(values, t.q, t.psi), dtype=np.uint32), f"intt/N={n}")


@pytest.mark.parametrize(
    "n,k", [pytest.param(n, k, id=f"roundtrip/N={n}/limbs={k}") for n, k in [(16, 64), (1024, 5), (4096, 3), (8192, 2)]]
)
def test_round_trip_and_batching(n, k, rng, expect_equal, residues):
    limbs = [int(l) for l in rng.choice(64, size=k, replace=False)]
    tables = [NttTable(PRIMES[l], n) for l in limbs]
    a = residues(rng, [t.q for t in tables], n)
    batched = ntt(a, tables)
    rowwise = np.stack([tables[r].forward(a[r]) for r in range(k)])
    expect_equal(batched, rowwise, f"ntt/N={n}/limbs={k} batched vs row by row")
    expect_equal(intt(batched, tables), a, f"intt(ntt)/N={n}/limbs={k}")
    expect_equal(ntt(intt(a, tables), tables), a, f"ntt(intt)/N={n}/limbs={k}")


def test_convolution_theorem(rng, expect_equal):
    n, q = 64, PRIMES[2]
    t = NttTable(q, n)
    a = rng.integers(0, q, n, dtype=np.uint64)
    b = rng.integers(0, q, n, dtype=np.uint64)
    prod = ntt(a, t).astype(np.uint64) * ntt(b, t).astype(np.uint64) % np.uint64(q)
    expect_equal(intt(prod, t), np.array(negacyclic_product(a, b, q), dtype=np.uint32), "ntt/N=64 convolution")


def test_extreme_values_and_dtypes(expect_equal):
    n, q = 256, PRIMES[63]
    t = NttTable(q, n)
    top = np.full(n, q - 1, dtype=np.uint64)
    expect_equal(intt(ntt(top, t), t), top.astype(np.uint32), "round trip of q-1")
    # A constant polynomial c evaluates to c everywhere.
    expect_equal(ntt(np.eye(1, n, dtype=np.uint32)[0] * 7, t), np.full(n, 7, dtype=np.uint32), "ntt of 7")
    small = np.arange(n, dtype=np.uint16)
    for dtype in (np.uint16, np.uint32, np.uint64, np.int64):
        have = ntt(small.astype(dtype), t)
        assert have.dtype == np.uint32
        expect_equal(have, ntt(small, t), f"dtype {dtype.__name__}")


def test_leading_shape_single_table(rng, expect_equal):
    t = NttTable(PRIMES[3], 64)
    a = rng.integers(0, t.q, (2, 3, 64), dtype=np.uint64)
    have = ntt(a, t)
    assert have.shape == (2, 3, 64)
    expect_equal(have.reshape(6, 64), np.stack([t.forward(row) for row in a.reshape(6, 64)]), "leading shape")
    expect_equal(intt(have, t), a.astype(np.uint32), "leading shape round trip")


def test_large_n_spot_check(rng):
    """At N = 65536 (transposed-layout stages in use), check a few outputs against the direct sum."""
    n, q = 65536, PRIMES[0]
    t = NttTable(q, n)
    a = rng.integers(0, q, n, dtype=np.uint64)
    have = ntt(a, t)
    br = bit_reverse(n)
    coeffs = [int(v) for v in a]
    for j in (0, 1, 255, 256, 40000, n - 1):
        root = pow(t.psi, 2 * int(br[j]) + 1, q)
        acc, power = 0, 1
        for c in coeffs:
            acc = (acc + c * power) % q
            power = power * root % q
        assert int(have[j]) == acc, f"ntt/N={n} output {j}: want {acc}, have {int(have[j])}"
    assert np.array_equal(intt(have, t), a.astype(np.uint32))


def test_shape_errors():
    t = NttTable(PRIMES[0], 16)
    with pytest.raises(ValueError, match="last axis has length 8, want N = 16"):
        ntt(np.zeros(8, np.uint32), t)
    with pytest.raises(ValueError, match=r"array of shape \(2, 16\) does not match 1 tables of N = 16"):
        ntt(np.zeros((2, 16), np.uint32), [t])
    with pytest.raises(ValueError, match="N = 24 is not a power of two >= 2"):
        NttTable(PRIMES[0], 24)


def test_views_are_read_not_written(rng, expect_equal):
    t = NttTable(PRIMES[4], 64)
    base = rng.integers(0, t.q, (64, 3), dtype=np.uint64)
    view = base.T  # (3, 64), not C-contiguous
    keep = base.copy()
    have = ntt(view, [t, t, t])
    expect_equal(have, np.stack([t.forward(np.ascontiguousarray(row)) for row in view]), "ntt of a strided view")
    expect_equal(intt(have[:, ::1], [t] * 3), view.astype(np.uint32), "intt round trip")
    expect_equal(base, keep, "input left unchanged")
    assert ntt(np.zeros((0, 64), np.uint32), []).shape == (0, 64)
