"""The reference interpreter: every opcode against a slow big-integer model, the mailbox
scheduler, and errors (deadlock, read before write)."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.errors import DeadlockError, ExecutionError
from caramel.execute.reference import run_reference
from caramel.parse import parse_stream
from caramel.program import Manifest, Mem, Program
from caramel.ring import Context, Mode
from caramel.ring.modular import inv_mod

N = 64
CTX = Context(n=N)


def program(*streams: str) -> Program:
    """A program from instruction texts (one per chip), without manifests."""
    parsed = tuple(
        parse_stream(f"Instruction Stream {c}:\n{text.strip()}\n", f"instructions{c}", c) for c, text in enumerate(streams)
    )
    return Program("test", "<test>", parsed, Manifest("<none>", ()))


def rand(rng, limb: int) -> np.ndarray:
    return rng.integers(0, CTX.q(limb), N, dtype=np.uint64).astype(np.uint32)


def run(text: str, memory: dict, mode=Mode.EXACT) -> dict:
    return run_reference(program(text), CTX, memory, mode).memory


def ints(a) -> list[int]:
    return [int(x) for x in a]


def naive_ntt(coeffs: list[int], limb: int) -> list[int]:
    """A[j] = sum_i a_i psi^{(2 br(j) + 1) i} mod q, with Python integers."""
    q, psi = CTX.q(limb), CTX.ntt_table(limb).psi
    bits = N.bit_length() - 1
    br = [int(f"{j:0{bits}b}"[::-1], 2) for j in range(N)]
    return [sum(a * pow(psi, (2 * br[j] + 1) * i, q) for i, a in enumerate(coeffs)) % q for j in range(N)]


@pytest.mark.parametrize("limb", [0, 7, 63], ids=lambda l: f"limb={l}")
@pytest.mark.parametrize(
    "op, model",
    [
        ("add", lambda a, b, q: (a + b) % q),
        ("sub", lambda a, b, q: (a - b) % q),
        ("mul", lambda a, b, q: a * b % q),
        ("mup", lambda a, b, q: a * b % q),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_binary_ops(op, model, limb):
    rng = np.random.default_rng(limb)
    a, b = rand(rng, limb), rand(rng, limb)
    mem = run(f"load r0: i1({limb})\nload r1: i2({limb})\n{op} r2: r0[X], r1[X] | {limb}\nstore r2[X]: v3({limb})",
              {Mem("i1", limb): a, Mem("i2", limb): b})
    q = CTX.q(limb)
    want = [model(x, y, q) for x, y in zip(ints(a), ints(b))]
    assert ints(mem[Mem("v3", limb)]) == want, f"{op}: want {want[:4]}..., have {ints(mem[Mem('v3', limb)])[:4]}..."


@pytest.mark.parametrize(
    "op, model",
    [("ads", lambda a, s, q: (a + s) % q), ("sus", lambda a, s, q: (a - s) % q), ("mus", lambda a, s, q: a * s % q)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_scalar_ops(op, model):
    rng, limb = np.random.default_rng(1), 5
    a, s = rand(rng, limb), int(rng.integers(0, CTX.q(limb)))
    mem = run(f"load r0: i1({limb})\nloas s0: s2({limb})\n{op} r1: r0, s0[X] | {limb}\nstore r1: v3({limb})",
              {Mem("i1", limb): a, Mem("s2", limb): np.array(s, dtype=np.uint32)})
    q = CTX.q(limb)
    assert ints(mem[Mem("v3", limb)]) == [model(x, s, q) for x in ints(a)]


def test_neg_mov_and_same_register_twice():
    rng, limb = np.random.default_rng(2), 9
    a = rand(rng, limb)
    q = CTX.q(limb)
    mem = run(
        f"load r0: i1({limb})\nneg r1: r0 | {limb}\nmov r2: r1 | {limb}\nadd r3: r0, r0[X] | {limb}\n"
        f"store r2: v1({limb})\nstore r3: v2({limb})",
        {Mem("i1", limb): a},
    )
    assert ints(mem[Mem("v1", limb)]) == [(-x) % q for x in ints(a)]
    assert ints(mem[Mem("v2", limb)]) == [2 * x % q for x in ints(a)]


@pytest.mark.parametrize("limb", [0, 63], ids=lambda l: f"ntt/N={N}/limb={l}")
def test_ntt_int_against_direct_dft(limb):
    rng = np.random.default_rng(3)
    a = rand(rng, limb)
    mem = run(f"load r0: i1({limb})\nntt r1: r0 | {limb}\nint r2: r1 | {limb}\nstore r1: v1({limb})\nstore r2: v2({limb})",
              {Mem("i1", limb): a})
    assert ints(mem[Mem("v1", limb)]) == naive_ntt(ints(a), limb)
    assert ints(mem[Mem("v2", limb)]) == ints(a)


def substitute(coeffs: list[int], g: int, q: int) -> list[int]:
    """a(X^g) mod (X^N + 1, q) with Python integers."""
    out = [0] * N
    for i, c in enumerate(coeffs):
        e = i * g % (2 * N)
        if e < N:
            out[e] = (out[e] + c) % q
        else:
            out[e - N] = (out[e - N] - c) % q
    return out


@pytest.mark.parametrize("line, g", [("rot 3", pow(5, 3, 2 * N)), ("rot -2", pow(5, N // 2 - 2, 2 * N)),
                                     ("rot 16384", pow(5, 16384 % (N // 2), 2 * N)), ("con", 2 * N - 1)])
def test_automorphisms_against_substitution(line, g):
    rng, limb = np.random.default_rng(4), 2
    coeffs = ints(rand(rng, limb))
    a = CTX.ntt(np.array(coeffs, dtype=np.uint32), limb)
    mem = run(f"load r0: i1({limb})\n{line} r1: r0 | {limb}\nstore r1: v1({limb})", {Mem("i1", limb): a})
    want = naive_ntt(substitute(coeffs, g, CTX.q(limb)), limb)
    assert ints(mem[Mem("v1", limb)]) == want


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_sud_register_form(mode):
    rng, t, limb = np.random.default_rng(5), 6, 2
    a_ntt, top = rand(rng, limb), rand(rng, t)
    mem = run(f"load r0: i1({limb})\nload r1: i2({t})\nint r2: r1 | {t}\nsud r3: r0, r2 | {limb}\nstore r3: v1({limb})",
              {Mem("i1", limb): a_ntt, Mem("i2", t): top}, mode)
    qt, ql = CTX.q(t), CTX.q(limb)
    rb = ints(CTX.intt(top, t))
    lift = [x if (mode == Mode.EXACT and x <= (qt - 1) // 2) or mode != Mode.EXACT else x - qt for x in rb]
    a = ints(CTX.intt(a_ntt, limb))
    want_coeffs = [(x - y) * inv_mod(qt, ql) % ql for x, y in zip(a, lift)]
    assert ints(mem[Mem("v1", limb)]) == naive_ntt(want_coeffs, limb)


def crt(residues: list[list[int]], primes: list[int]) -> list[int]:
    Q = 1
    for p in primes:
        Q *= p
    return [sum(r[i] * (Q // p) * pow(Q // p, -1, p) for r, p in zip(residues, primes)) % Q for i in range(N)]


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_bcu_modup_and_moddown(mode):
    """bci/pl1/bcw then reads by ntt and sud; exact mode = centred CRT lift, the others their formulas."""
    rng = np.random.default_rng(6)
    ins, outs = [0, 1, 2], [3, 62, 63]
    data = {l: rand(rng, l) for l in ins}
    acc = rand(rng, 3)
    text = "\n".join(
        [f"load r{l}: i1({l})" for l in ins]
        + ["load r9: i2(3)", "bci B0: [3,62,63], [0,1,2]", "pl1 B0: r0 | 0", "int r5: r1 | 1", "bcw B0: r5 | 1", "pl1 B0: r2 | 2",
           "ntt r6: b0{1} | 62", "ntt r7: b0{2} | 63", "sud r8: r9, b0{0} | 3",
           "store r6: v1(62)", "store r7: v1(63)", "store r8: v1(3)"]
    )
    mem = run(text, {**{Mem("i1", l): data[l] for l in ins}, Mem("i2", 3): acc}, mode)
    primes = [CTX.q(l) for l in ins]
    xs = [ints(CTX.intt(data[l], l)) for l in ins]
    Q = primes[0] * primes[1] * primes[2]
    if mode == Mode.EXACT:
        X = [v - Q if v > Q // 2 else v for v in crt(xs, primes)]
    elif mode == Mode.TEXTBOOK:
        X = [sum((x[i] * pow(Q // p, -1, p) % p) * (Q // p) for x, p in zip(xs, primes)) for i in range(N)]
    else:
        X = [sum(x[i] * (Q // p) * pow(Q // p, -1, p) for x, p in zip(xs, primes)) for i in range(N)]
    for l in (62, 63):
        assert ints(mem[Mem("v1", l)]) == naive_ntt([v % CTX.q(l) for v in X], l), f"slot for limb {l}"
    q3 = CTX.q(3)
    a = ints(CTX.intt(acc, 3))
    want = [(x - v) * pow(Q, -1, q3) % q3 for x, v in zip(a, X)]
    assert ints(mem[Mem("v1", 3)]) == naive_ntt(want, 3)


def test_rsi_rsv_mod_is_unsigned_crt():
    rng = np.random.default_rng(7)
    basis = [0, 1, 2]
    data = {l: rand(rng, l) for l in basis}
    text = "\n".join(
        [f"load r{l}: i1({l})" for l in basis]
        + ["rsi {r10, r11, r12}"]
        + [f"rsv {{r10, r11, r12}}: r{l}[X]: [0,1,2] | {l}" for l in basis]
        + ["mod r20: {r10, r11, r12} | 7", "mod r21: {r10[X], r11[X], r12[X]} | 0", "store r20: v1(7)", "store r21: v1(0)"]
    )
    mem = run(text, {Mem("i1", l): data[l] for l in basis})
    X = crt([ints(data[l]) for l in basis], [CTX.q(l) for l in basis])
    assert ints(mem[Mem("v1", 7)]) == [v % CTX.q(7) for v in X]
    assert ints(mem[Mem("v1", 0)]) == [v % CTX.q(0) for v in X]


def test_dis_rcv_joi_on_three_chips():
    rng, limb = np.random.default_rng(8), 4
    vals = [rand(rng, limb) for _ in range(3)]
    sync = (1 << 16) + limb
    joi = (2 << 16) + limb
    streams = [
        f"load r0: i1({limb})\ndis @ {sync}:3 : r0\njoi @ {joi}:3 r1: r0[X] | {limb}\nstore r1: v1({limb})",
        f"rcv @ {sync}:3 r5: \nstore r5: v2({limb})\nload r0: i2({limb})\njoi @ {joi}:3 : r0[X] | {limb}",
        f"joi @ {joi}:3 :  | {limb}\nrcv @ {sync}:3 r2: \nstore r2: v3({limb})",
    ]
    memory = {Mem("i1", limb): vals[0], Mem("i2", limb): vals[1]}
    result = run_reference(program(*streams), CTX, memory)
    q = CTX.q(limb)
    assert ints(result.stores[0][Mem("v1", limb)]) == [(a + b) % q for a, b in zip(ints(vals[0]), ints(vals[1]))]
    assert ints(result.stores[1][Mem("v2", limb)]) == ints(vals[0])
    assert ints(result.stores[2][Mem("v3", limb)]) == ints(vals[0])


def test_deadlock_names_every_blocked_chip():
    streams = ["rcv @ 65537:2 r0: \ndis @ 65536:2 : r0", "rcv @ 65536:2 r0: \ndis @ 65537:2 : r0"]
    with pytest.raises(DeadlockError) as err:
        run_reference(program(*streams), CTX, {})
    msg = str(err.value)
    assert "chip 0 waits at instructions0:2 (rcv @ 65537:2 r0: )" in msg
    assert "chip 1 waits at instructions1:2 (rcv @ 65536:2 r0: )" in msg


def test_read_before_write_and_missing_memory_are_errors():
    with pytest.raises(ExecutionError, match=r"instructions0:2 \(add r2: r0, r1 \| 0\): register r0 is read before"):
        run("add r2: r0, r1 | 0", {})
    with pytest.raises(ExecutionError, match="'rec' is not supported"):
        run("rec r0: i1(0) | 0", {Mem("i1", 0): np.zeros(N, np.uint32)})


def test_input_image_problems_are_listed_together():
    from caramel.errors import BindingError

    text = "load r0: i1(0)\nload r1: i2(1)\nload r2: i3(2)\nadd r3: r0, r1 | 0"
    bad = {Mem("i2", 1): np.full(N, CTX.q(1), dtype=np.uint32), Mem("i3", 2): np.zeros(N + 1, dtype=np.uint32)}
    with pytest.raises(BindingError) as err:
        run(text, bad)
    msg = str(err.value)
    assert "1 input limb(s) not provided: i1(0) (first loaded at instructions0:2)" in msg
    assert f"i2(1): residues must lie in [0, q_1 = {CTX.q(1)})" in msg
    assert "i3(2): shape (65,), expected (64,)" in msg
    with pytest.raises(BindingError, match=r"i1\(0\): dtype float64 is not an integer type"):
        run("load r0: i1(0)", {Mem("i1", 0): np.zeros(N)})
