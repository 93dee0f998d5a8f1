"""basis: every base-conversion mode against exact CRT arithmetic with Python ints."""

from __future__ import annotations

import math

import numpy as np
import pytest

from caramel.ring import PRIMES, BaseConverter, Mode, ntt_primes


def crt_value(x, primes) -> list[int]:
    """The CRT value X in [0, Q) of each column of x."""
    big_q = math.prod(primes)
    out = []
    for i in range(x.shape[1]):
        acc = 0
        for k, q in enumerate(primes):
            qhat = big_q // q
            acc += int(x[k, i]) * pow(qhat, -1, q) % q * qhat
        out.append(acc % big_q)
    return out


def model_textbook(x, in_primes, out_primes) -> np.ndarray:
    big_q = math.prod(in_primes)
    rows = []
    for p in out_primes:
        row = []
        for i in range(x.shape[1]):
            acc = 0
            for k, q in enumerate(in_primes):
                qhat = big_q // q
                acc += int(x[k, i]) * pow(qhat, -1, q) % q * qhat  # t_k * Qhat_k, exact integer
            row.append(acc % p)
        rows.append(row)
    return np.array(rows, dtype=np.uint32).reshape(len(out_primes), x.shape[1])


def model_emulator(x, in_primes, out_primes) -> np.ndarray:
    big_q = math.prod(in_primes)
    rows = []
    for p in out_primes:
        factors = [(big_q // q) % p * pow(big_q // q, -1, q) % p for q in in_primes]
        rows.append([sum(int(x[k, i]) * factors[k] for k in range(len(in_primes))) % p for i in range(x.shape[1])])
    return np.array(rows, dtype=np.uint32).reshape(len(out_primes), x.shape[1])


def model_exact(x, in_primes, out_primes) -> np.ndarray:
    """The centred CRT value of x modulo Q_S, reduced mod each output prime."""
    big_q = math.prod(in_primes)
    values = [v - big_q if v > (big_q - 1) // 2 else v for v in crt_value(x, in_primes)]
    rows = [[v % p for v in values] for p in out_primes]
    return np.array(rows, dtype=np.uint32).reshape(len(out_primes), len(values))


def model_exact_float(x, in_primes, out_primes) -> np.ndarray:
    """The EXACT formula itself, with Python floats (IEEE doubles, sequential, no FMA)."""
    big_q = math.prod(in_primes)
    n = x.shape[1]
    t = [[int(x[k, i]) * pow(big_q // q, -1, q) % q for i in range(n)] for k, q in enumerate(in_primes)]
    v = []
    for i in range(n):
        f = 0.0
        for k, q in enumerate(in_primes):
            f = f + float(t[k][i]) * (1.0 / q)
        v.append(math.floor(f + 0.5))
    rows = [
        [(sum(t[k][i] * (big_q // q) for k, q in enumerate(in_primes)) - v[i] * big_q) % p for i in range(n)]
        for p in out_primes
    ]
    return np.array(rows, dtype=np.uint32).reshape(len(out_primes), n)


SHAPES = [  # (input limbs, output limbs)
    ([0], [1, 2, 63]),
    ([0, 1, 2], [61, 62, 63]),
    ([59, 60, 61, 62, 63], [0, 1, 2, 3, 4]),
    (list(range(12)), list(range(52, 64))),
    (list(range(51)), [63, 62, 51]),
    ([3, 5], []),
]

MODELS = {Mode.TEXTBOOK: model_textbook, Mode.EMULATOR: model_emulator, Mode.EXACT: model_exact}


@pytest.mark.parametrize(
    "mode,ins,outs",
    [
        pytest.param(mode, ins, outs, id=f"bconv/{mode.value}/N=64/in={len(ins)}/out={len(outs)}")
        for mode in Mode
        for ins, outs in SHAPES
    ],
)
def test_convert_against_model(mode, ins, outs, rng, expect_equal, residues):
    in_primes = [PRIMES[l] for l in ins]
    out_primes = [PRIMES[l] for l in outs]
    x = residues(rng, in_primes, 64)
    have = BaseConverter(in_primes, out_primes).convert(x, mode)
    assert have.dtype == np.uint32 and have.shape == (len(outs), 64)
    expect_equal(have, MODELS[mode](x, in_primes, out_primes), f"{mode.value} {len(ins)}->{len(outs)}")


@pytest.mark.parametrize("k", [2, 5, 20, 51], ids=lambda k: f"bconv/exact-float/in={k}")
def test_exact_float_formula_is_centred_value(k, rng, expect_equal, residues):
    """On random inputs the float rounding of EXACT gives exactly the centred CRT value."""
    in_primes = list(PRIMES[:k])
    out_primes = [PRIMES[63], PRIMES[62]]
    x = residues(rng, in_primes, 48)
    formula = model_exact_float(x, in_primes, out_primes)
    expect_equal(formula, model_exact(x, in_primes, out_primes), "float formula vs centred value")
    expect_equal(BaseConverter(in_primes, out_primes).convert(x, "exact"), formula, "kernel vs float formula")


def test_exact_recovers_small_signed_values(rng, expect_equal):
    in_primes = list(PRIMES[:6])
    out_primes = list(PRIMES[58:])
    values = rng.integers(-(10**6), 10**6, 256)
    values[:4] = [0, -1, 1, -(10**6)]
    x = np.array([[int(v) % q for v in values] for q in in_primes], dtype=np.uint32)
    have = BaseConverter(in_primes, out_primes).convert(x, Mode.EXACT)
    want = np.array([[int(v) % p for v in values] for p in out_primes], dtype=np.uint32)
    expect_equal(have, want, "exact conversion of small signed values")


def test_textbook_is_crt_plus_multiple_of_q(rng, residues):
    in_primes, out_primes = list(PRIMES[:4]), list(PRIMES[60:])
    x = residues(rng, in_primes, 32)
    have = BaseConverter(in_primes, out_primes).convert(x, Mode.TEXTBOOK)
    big_q = math.prod(in_primes)
    for i, value in enumerate(crt_value(x, in_primes)):
        hits = [u for u in range(len(in_primes)) if all(int(have[j, i]) == (value + u * big_q) % p
                                                        for j, p in enumerate(out_primes))]
        assert hits, f"column {i}: no u in [0, {len(in_primes)}) gives X + u*Q"


def test_single_input_modes_agree(rng, expect_equal, residues):
    conv = BaseConverter([PRIMES[63]], [PRIMES[0], PRIMES[1]])
    x = residues(rng, [PRIMES[63]], 128)
    textbook = conv.convert(x, Mode.TEXTBOOK)
    expect_equal(conv.convert(x, Mode.EMULATOR), textbook, "emulator vs textbook at |S| = 1")
    expect_equal(textbook, np.stack([x[0] % p for p in conv.out_primes]), "unsigned lift")


def test_overlapping_output_prime_returns_input(rng, expect_equal, residues):
    """ISA 8.7: an output prime that is also an input prime gets that input back (textbook and exact)."""
    in_primes = list(PRIMES[:3])
    x = residues(rng, in_primes, 64)
    conv = BaseConverter(in_primes, [PRIMES[1], PRIMES[40]])
    for mode in (Mode.TEXTBOOK, Mode.EXACT):
        expect_equal(conv.convert(x, mode)[0], x[1], f"{mode.value}: overlapping prime")
    assert conv.product_inv_mod_out[0] == 0


def test_many_wide_primes_force_intermediate_reduction(rng, expect_equal, residues):
    """30-bit moduli and 40 inputs overflow one uint64 accumulator: the kernel must reduce on the way."""
    primes = ntt_primes(44, bits=30, log_modulus=12)
    in_primes, out_primes = list(primes[:40]), list(primes[40:])
    conv = BaseConverter(in_primes, out_primes)
    assert conv._batch < len(in_primes)
    x = residues(rng, in_primes, 16)
    for mode in Mode:
        expect_equal(conv.convert(x, mode), MODELS[mode](x, in_primes, out_primes), f"{mode.value} wide primes")


def test_constants():
    in_primes, out_primes = list(PRIMES[:3]), list(PRIMES[61:])
    conv = BaseConverter(in_primes, out_primes)
    big_q = math.prod(in_primes)
    assert conv.product == big_q
    for k, q in enumerate(in_primes):
        assert int(conv.qhat_inv[k]) * (big_q // q) % q == 1
    for j, p in enumerate(out_primes):
        assert int(conv.product_mod_out[j]) == big_q % p
        assert int(conv.product_inv_mod_out[j]) * big_q % p == 1
        for k, q in enumerate(in_primes):
            assert int(conv.qhat_mod_out[j, k]) == (big_q // q) % p
            assert int(conv.factors[j, k]) == (big_q // q) % p * pow(big_q // q, -1, q) % p
        assert conv.reciprocals[0] == 1.0 / in_primes[0]


def test_errors():
    with pytest.raises(ValueError, match="distinct"):
        BaseConverter([PRIMES[0], PRIMES[0]], [PRIMES[1]])
    with pytest.raises(ValueError, match="at least one"):
        BaseConverter([], [PRIMES[1]])
    conv = BaseConverter([PRIMES[0], PRIMES[1]], [PRIMES[2]])
    with pytest.raises(ValueError, match="shape"):
        conv.convert(np.zeros((3, 8), np.uint32))
    with pytest.raises(ValueError, match="'fast' is not a valid Mode"):
        conv.convert(np.zeros((2, 8), np.uint32), "fast")
