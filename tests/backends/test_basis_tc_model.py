"""A NumPy model of the tensor-core base conversion (caramel.backends.cuda.basis, ``tensor=True``)
against caramel.ring's BaseConverter, without a GPU.

The model decodes the host-built B fragments (``tc_fragments``) and the A rows the kernel writes
(``tc_words``) with the register layout of PTX ``mma.m16n8k32`` (u8; lane = 4 g + t: A a0/a2 = row g,
columns 4t + i / 16 + 4t + i, a1/a3 the same at row g + 8; B b0/b1 = column g, rows 4t + i / 16 + 4t + i;
C c0, c1 = row g, columns 2t, 2t + 1, c2, c3 row g + 8), sums the byte products in int64 with the
kernel's int32 bound checked, folds R_b 2^(8b) and reduces, as the kernel's epilogue does (``tc_reduce``,
against Python integers).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from caramel.backends.cuda import basis as dbasis
from caramel.ring import Context, Mode


def decode_b(frag: np.ndarray) -> np.ndarray:
    """The byte planes (4, 32 KC, 8 DT) that the lanes' (b0, b1) registers hold (PTX layout)."""
    dt, _, kc, _, _ = frag.shape
    out = np.zeros((4, 32 * kc, 8 * dt), dtype=np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for half in range(2):
            word = frag[:, :, :, lane, half].astype(np.int64)  # (DT, 4, KC)
            for i in range(4):
                byte = (word >> (8 * i)) & 255
                for c in range(kc):
                    out[:, 32 * c + 16 * half + 4 * t + i, g::8][:, :dt] = byte[:, :, c].T
    return out


def decode_a(words: np.ndarray) -> np.ndarray:
    """The byte matrix (N, 32 KC) that the A fragments read from the rows (a0..a3 of each lane)."""
    n, kw = words.shape
    out = np.zeros((n, 4 * kw), dtype=np.int64)
    for c in range(kw // 8):
        for t in range(4):
            for half in range(2):  # a0/a1: word 8c + t -> columns 32c + 4t + i; a2/a3: 8c + 4 + t -> + 16
                w = words[:, 8 * c + 4 * half + t].astype(np.int64)
                for i in range(4):
                    out[:, 32 * c + 16 * half + 4 * t + i] = (w >> (8 * i)) & 255
    return out


def model(conv, x: np.ndarray, mode: Mode) -> np.ndarray:
    """The kernel's residues (D, N) for input x (S, N) in mode."""
    q = np.array(conv.in_primes, dtype=np.uint64)[:, None]
    x = x.astype(np.uint64)
    t = x if mode is Mode.EMULATOR else x * conv.qhat_inv.astype(np.uint64)[:, None] % q
    v = conv.rounding(t).astype(np.uint32) if mode is Mode.EXACT else None
    table = conv.factors if mode is Mode.EMULATOR else conv.qhat_mod_out
    neg_q = [(p - int(m)) % p for p, m in zip(conv.out_primes, conv.product_mod_out)]
    frag = dbasis.tc_fragments(dbasis.tc_table(table.T, neg_q, conv.out_primes))
    a = decode_a(dbasis.tc_words(t.astype(np.uint32), v))
    b = decode_b(frag)
    r = np.einsum("nk,bkd->bnd", a, b)  # R_b, (4, N, 8 DT)
    assert r.max() < 2**31, "an int32 accumulator would overflow"
    d = len(conv.out_primes)
    folded = sum(r[j, :, :d].astype(object) << (8 * j) for j in range(4))
    assert max(int(z) for z in folded.ravel()) < 2**64
    p = np.array(conv.out_primes, dtype=object)
    want = (folded % p).T.astype(np.uint32)
    # the kernel's epilogue (basis.tc_reduce, 32-bit arithmetic) gives the same residues
    have = dbasis.tc_reduce(r[:, :, :d], dbasis.tc_out_constants(conv.out_primes)[:d]).T
    np.testing.assert_array_equal(have, want)
    return have


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (13, 50), (21, 42), (32, 17), (60, 9), (64, 3), (7, 8), (8, 11),
                                   (16, 16)],
                         ids=lambda s: f"S={s[0]},D={s[1]}")
def test_tc_model_matches_ring(rng, mode, shape):
    ctx = Context(256)
    s, d = shape
    perm = [int(v) for v in rng.permutation(64)]
    conv = ctx.base_converter(sorted(perm[:s]), sorted(perm[s : s + d]) if s + d <= 64 else perm[-d:])
    x = np.stack([rng.integers(0, q, ctx.n, dtype=np.uint64) for q in conv.in_primes]).astype(np.uint32)
    x[:, 0] = [q - 1 for q in conv.in_primes]  # the largest residues
    np.testing.assert_array_equal(model(conv, x, mode), conv.convert(x, mode))


def test_tc_layout():
    assert dbasis.tc_layout(1) == (4, 1)
    assert dbasis.tc_layout(7) == (8, 1)  # 7 inputs and v: 32 rows
    assert dbasis.tc_layout(8) == (12, 2)
    assert dbasis.tc_layout(13) == (16, 2)
    assert dbasis.tc_layout(16) == (20, 3)
    assert dbasis.tc_layout(60) == (64, 8)
    assert dbasis.tc_layout(64) == (68, 9)


def test_tc_row_gives_16_byte_stores(rng):
    """tc_row is a permutation of a warp's 32 rows; with coefficient l in MMA row tc_row(l), the C
    elements of one output that lane (g, t) holds (row g, g + 8 of m-tile 0, then of m-tile 1, the
    kernel's y.x .. y.w) are coefficients 4 g .. 4 g + 3 in order, so the kernel's one uint4 store at
    coefficient 4 g puts every result of the warp in its place."""
    rows = [dbasis.tc_row(l) for l in range(32)]
    assert sorted(rows) == list(range(32))
    results = rng.integers(0, 2**30, (5, 128), dtype=np.int64)  # (D, coefficients of a block)
    c = np.empty_like(results)  # C by MMA row: coefficient l of warp w sits in row 32 w + tc_row(l)
    for w in range(4):
        for l in range(32):
            c[:, 32 * w + rows[l]] = results[:, 32 * w + l]
    stored = np.full_like(results, -1)
    for w in range(4):
        for g in range(8):  # lanes 4 g + t (t: the output) store the same four rows of their outputs
            stored[:, 32 * w + 4 * g : 32 * w + 4 * g + 4] = c[:, [32 * w + 16 * m + 8 * hi + g
                                                                  for m in (0, 1) for hi in (0, 1)]]
    np.testing.assert_array_equal(stored, results)


@pytest.mark.parametrize("s", [1, 13, 63, 64])
def test_tc_reduce_extremes(rng, s):
    """tc_reduce (the kernel's 32-bit epilogue) is exact up to the largest byte-plane sums: R_b up to
    (4 S + 1) 255^2 (every byte 255), zero, and random, for the largest and smallest primes."""
    ctx = Context(256)
    primes = sorted(ctx.primes)
    out = [primes[0], primes[1], primes[-2], primes[-1]]
    top = (4 * s + 1) * 255 * 255
    r = rng.integers(0, top + 1, (4, 1000, len(out)), dtype=np.int64)
    r[:, 0] = top
    r[:, 1] = 0
    r[:, 2, :] = [[top], [0], [top], [0]]
    r[:, 3, :] = [[0], [top], [0], [top]]
    have = dbasis.tc_reduce(r, dbasis.tc_out_constants(out)[: len(out)])
    value = sum(r[b].astype(object) << (8 * b) for b in range(4))
    np.testing.assert_array_equal(have, (value % np.array(out, dtype=object)).astype(np.uint32))


def test_tc_out_constants():
    p = 268369921
    row = dbasis.tc_out_constants([p, 65537])
    assert row.shape == (8, 4) and not row[2:].any()
    assert list(row[0]) == [p, 65536, (65536 << 32) // p, (1 << 32) // p]
    assert list(row[1]) == [65537, 65536, (65536 << 32) // 65537, (1 << 32) // 65537]


@pytest.mark.parametrize("kc,blocks,want", [(1, 512, (2, 4)), (3, 1056, (2, 4)), (2, 1057, (1, 6)), (3, 2048, (1, 6)),
                                            (4, 512, (1, 4)), (9, 4096, (1, 4))])
def test_tc_build(kc, blocks, want):
    """Two output tiles an iteration up to two waves of 4 blocks (132 multiprocessors), 6 blocks
    of <= 80 registers beyond, and (1, 4) for KC > TC_SMALL_KC."""
    assert dbasis.tc_build(kc, blocks, 132) == want


@pytest.mark.parametrize("kc,pf", [(1, 8), (2, 16), (3, 24), (9, 24)])
def test_tc_source_defines(kc, pf):
    """The build's defines: KC, the input loads in flight min(8 KC, TC_PF_MAX) (a multiple of 4 that
    covers SP) and the launch bound; the unroll pragma replaced."""
    src = dbasis.tc_source(kc, 2, 6)
    assert f"#define TC_KC {kc}\n" in src and f"#define TC_PF {pf}\n" in src and "#define TC_MINB 6\n" in src
    assert "#pragma unroll 2\n" in src and "#pragma unroll TC_UNROLL" not in src
    assert pf % 4 == 0 and pf >= min(8 * kc, dbasis.TC_PF_MAX)


def test_the_kernel_of_a_conversion():
    """The tensor-core kernel where it fits (N a multiple of TC_ROWS, at most 64 outputs) in the build tc_build
    picks for the device, or the one asked; else the tiled kernel; the mode names the kernel."""
    assert dbasis.tensor_fits(4096, 64) and not dbasis.tensor_fits(4096, 65) and not dbasis.tensor_fits(64, 3)
    kc = dbasis.tc_layout(13)[1]
    src, name = dbasis.conversion_kernel(65536, 13, 2, 2, True, 132)
    assert name == "base_convert_tc_exact" and src == dbasis.tc_source(kc, *dbasis.tc_build(kc, 1024, 132))
    assert dbasis.conversion_kernel(65536, 13, 2, 0, True, 132, (2, 1))[0] == dbasis.tc_source(kc, 2, 1)
    assert dbasis.conversion_kernel(64, 13, 2, 1, False) == (dbasis.source(), "base_convert_tiled_emulator")
    with pytest.raises(ValueError, match="unroll 3"):
        dbasis.conversion_kernel(65536, 13, 2, 0, True, 132, (3, 4))


def test_conversion_constants():
    """The constants both GPU conversions read (basis.BaseConversion, the NTT's converting load):
    (q_k, [Qhat_k^-1]_{q_k}, its Shoup constant, 0) per input, [-Q]_p per output."""
    ctx = Context(n=256)
    ins, outs = (0, 3, 5), (1, 2, 7)
    conv = ctx.base_converter(ins, outs)
    rows, neg_q = dbasis.conversion_constants(conv, "sum")
    big_q = ctx.q(0) * ctx.q(3) * ctx.q(5)
    for k, l in enumerate(ins):
        q = ctx.q(l)
        w = pow(big_q // q, -1, q)
        assert rows[k].tolist() == [q, w, (w << 32) // q, 0]
    assert neg_q == [(-big_q) % ctx.q(l) for l in outs]


def test_conversion_constants_refuse_an_overflowing_sum():
    class Huge:
        in_primes = [1 << 40] * 8
        out_primes = [1 << 30]

    with pytest.raises(ValueError, match="64-bit sum of a test would overflow"):
        dbasis.conversion_constants(Huge, "sum of a test")
