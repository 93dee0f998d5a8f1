"""Batched elementwise modular arithmetic over arena rows, and fused elementwise kernels.

Every operation here is an instance of one generated kernel family: a :class:`FusedProgram` is a
tiny SSA program over vector operands (limbs: arena rows) and scalar operands (residues in a small
device array), with one or more vector outputs. Its CUDA source is generated once per signature
(:meth:`FusedProgram.signature`) and cached per :class:`CudaRing`. A launch covers R rows: row r
reads its operands from ``arena[vec_slots[r, i]]`` and ``scalars[scalar_idx[r, j]]`` and writes
``arena[out_slots[r, o]]``, all modulo ``q = primes[prime_idx[r]]``. Operands must be canonical
residues; results are canonical. An output slot may equal an input slot of the same row (each
thread reads all its operands before it writes), but not a slot that another row reads.

Each thread handles 4 consecutive residues (16-byte loads and stores). A *gathered* operand
(``FusedProgram.gathered``: an automorphism computed in the load) is read at the permuted index
instead: x[j] = row[br(((g (2 br(j) + 1)) mod 2N - 1) / 2)], g = ``galois[r, m]`` (the formula of
:mod:`caramel.backends.cuda.automorphism`). An aligned block of 2^t outputs reads exactly one
aligned block of 2^t inputs; for t = 2 that is a thread's own 4 outputs: j = 4i + d moves only the
top two bits of g (2 br(j) + 1) mod 2N (by d' g mod 4, d' = br_2(d), a bijection for g odd), hence
only the low two bits of the source. So each thread loads the one aligned 16-byte word holding its
4 sources and permutes its components (:data:`GATHER_VECTOR`), and a warp's loads cover 512
contiguous bytes as a plain operand's do; otherwise 4 scalar loads per thread. A gathered
operand's slot must not be an output slot of the launch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from caramel.backends.cuda.context import CudaRing, cupy, index_array

THREADS = 256

#: A gathered operand is one 16-byte load per thread, its components permuted (see the module
#: docstring), instead of 4 scalar loads. Part of a gathering program's signature, so both variants
#: compile side by side (the GPU tests check both).
GATHER_VECTOR = True

#: Sums of products reduce once (see :meth:`FusedProgram.lazy_sums`): a vector ``add`` whose operand tree holds
#: products is one 64-bit accumulation and one Barrett reduction instead of a reduction per operation. Off, the
#: signature says ``|eager`` for programs it changes, so both variants compile side by side (the GPU tests check both).
LAZY_SUMS = True

#: Terms a 64-bit accumulator takes between two reductions: a term is a product of two residues (< 2^60, as the
#: kernels need q < 2^30) or a residue, so a reduced value plus 15 terms stays below 2^30 + 15 * 2^60 < 2^64.
LAZY_TERMS = 15

#: Operation name -> (arity, C expression template over a, b, q, mu).
OPS = {
    "add": (2, "add_mod({a}, {b}, q)"),
    "sub": (2, "sub_mod({a}, {b}, q)"),
    "mul": (2, "mul_mod({a}, {b}, q, mu)"),
    "neg": (1, "neg_mod({a}, q)"),
}


@dataclass(frozen=True)
class FusedOp:
    """One SSA operation: ``op`` (a key of :data:`OPS`) applied to the values ``args``."""

    op: str
    args: tuple[int, ...]


@dataclass(frozen=True)
class FusedProgram:
    """An elementwise program over ``n_vec`` vector and ``n_scalar`` scalar operands.

    Value numbering: 0 .. n_vec-1 are the vector operands, n_vec .. n_vec+n_scalar-1 the scalar
    operands, then one value per entry of ``ops`` in order. ``outputs`` lists the values written
    (vector-valued; an operand itself may be an output, which makes a copy). A value is a scalar
    when all its arguments are scalars; at least one output must be a vector.
    """

    n_vec: int
    n_scalar: int
    ops: tuple[FusedOp, ...]
    outputs: tuple[int, ...]
    gathered: tuple[int, ...] = ()
    transformed: tuple[int, ...] = ()

    def __post_init__(self):
        if self.n_vec < 0 or self.n_scalar < 0 or not self.outputs:
            raise ValueError("a fused program needs operands counts >= 0 and at least one output")
        for name in ("gathered", "transformed"):
            ks = getattr(self, name)
            if list(ks) != sorted(set(ks)) or any(not 0 <= k < self.n_vec for k in ks):
                raise ValueError(f"{name} operands must be distinct vector operands in ascending order: {ks}")
        from caramel.backends.cuda.ntt import EPILOGUE_MAX

        if len(self.transformed) > EPILOGUE_MAX or set(self.transformed) & set(self.gathered):
            raise ValueError(f"transformed operands: at most {EPILOGUE_MAX}, none of them gathered")
        kinds = self.kinds()
        for o in self.outputs:
            if not 0 <= o < len(kinds) or not kinds[o]:
                raise ValueError(f"output {o} is not a vector value of the program")

    def kinds(self) -> list[bool]:
        """kinds()[v] is True when value v is a vector (per residue), False for a scalar."""
        kinds = [True] * self.n_vec + [False] * self.n_scalar
        for i, op in enumerate(self.ops):
            arity = OPS.get(op.op, (None,))[0]
            if arity is None or len(op.args) != arity:
                raise ValueError(f"op {i}: unknown op {op.op!r} or wrong number of arguments")
            if any(not 0 <= a < len(kinds) for a in op.args):
                raise ValueError(f"op {i}: argument out of range {op.args}")
            kinds.append(any(kinds[a] for a in op.args))
        return kinds

    def signature(self) -> str:
        """The canonical text of the program, e.g. ``v2s1|add(0,1);mul(3,2)|4`` (then ``|g0,1`` for
        gathered operands and ``|t1`` for transformed ones; a program without any has the text, name and code it
        always had)."""
        body = ";".join(f"{op.op}({','.join(map(str, op.args))})" for op in self.ops)
        text = f"v{self.n_vec}s{self.n_scalar}|{body}|{','.join(map(str, self.outputs))}"
        if self.gathered:
            text += f"|g{','.join(map(str, self.gathered))}" + ("|v4" if GATHER_VECTOR else "")
        if self.transformed:
            text += f"|t{','.join(map(str, self.transformed))}"
        if not LAZY_SUMS and self.lazy_sums()[0]:
            text += "|eager"
        return text

    def lazy_sums(self) -> tuple[dict[int, tuple[tuple[int, ...], ...]], frozenset[int]]:
        """The vector sums that reduce once, and the values they hide. Sums: value v -> its terms, each ``(a, b)``
        (the product a b) or ``(a,)`` (the value a), v = sum of the terms mod q. A vector ``add`` absorbs each of
        its operands that is a vector ``add`` or ``mul`` read only there (not an output), recursively; an add that
        is not absorbed itself is a sum when its terms hold a product, and hides what it absorbed (no code of their
        own). Exact: the residue of the exact sum is what the chain of ``add_mod`` and ``mul_mod`` computes."""
        kinds = self.kinds()
        base = self.n_vec + self.n_scalar
        ops = {base + i: op for i, op in enumerate(self.ops)}
        uses = [0] * (base + len(self.ops))
        for a in [a for op in self.ops for a in op.args] + list(self.outputs):
            uses[a] += 1
        absorbed = {a for v, op in ops.items() if op.op == "add" and kinds[v] for a in op.args
                    if a in ops and kinds[a] and ops[a].op in ("add", "mul") and uses[a] == 1}

        def expand(v: int, hidden: list) -> tuple[tuple[int, ...], ...]:
            """The terms of add v's operands, appending the absorbed values they stand for to ``hidden``."""
            found = []
            for a in ops[v].args:
                if a not in absorbed:
                    found.append((a,))
                    continue
                hidden.append(a)
                found.extend([ops[a].args] if ops[a].op == "mul" else expand(a, hidden))
            return tuple(found)

        sums, hidden = {}, set()
        for v, op in ops.items():
            if op.op == "add" and kinds[v] and v not in absorbed:
                inside: list[int] = []
                found = expand(v, inside)
                if any(len(t) == 2 for t in found):
                    sums[v] = found
                    hidden.update(inside)
        return sums, frozenset(hidden)

    def kernel_name(self) -> str:
        return "fused_" + hashlib.sha1(self.signature().encode()).hexdigest()[:16]

    def source(self, logn: int = 0, lazy: bool = True, min_blocks: int | None = None) -> str:
        """CUDA source of the kernel (without the common helpers). With transformed operands and N = 2^logn >=
        8192: the epilogue kernel (:func:`caramel.backends.cuda.ntt.epilogue_source`, ``lazy`` as the column
        kernel's, launch bounds of ``min_blocks``); below, the transformed operands are plain (the transform ran
        whole)."""
        ng = len(self.gathered)
        gather_params = ", const int* __restrict__ galois, int logn" if ng else ""
        if self.transformed and logn > 12:
            from caramel.backends.cuda import ntt

            staged = ntt.epilogue_staged(self.transformed, self.plain(), min_blocks)
            scalar = ntt.epilogue_scalar(len(self.transformed))
            body = "\n".join("        " + line for line in self._body(self.transformed, staged, scalar))
            return "\n".join(self._gather_helpers()) + ntt.epilogue_source(
                logn, self.kernel_name(), self.transformed, self.n_vec, body, lazy, gather_params, min_blocks, staged)
        lines = self._gather_helpers()
        lines += [
            f'extern "C" __global__ void __launch_bounds__({THREADS}) {self.kernel_name()}(',
            "        u32* arena, const int* __restrict__ vec_slots, const int* __restrict__ scalar_idx,",
            "        const int* __restrict__ out_slots, const int* __restrict__ prime_idx,",
            "        const u32* __restrict__ scalars, const u32* __restrict__ pt, int n4, int tiles"
            + gather_params + ") {",
            "    const int r = blockIdx.x / tiles;",
            "    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;",
            "    if (i >= n4) return;",
            "    const int pi = prime_idx[r];",
            "    const u32 q = prime_q(pt, pi);",
            "    const u64 mu = prime_mu(pt, pi);",
            "    (void)mu;",
        ]
        lines += self._body()
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _gather_helpers(self) -> list[str]:
        """The device functions of gathered operands (none without)."""
        return [] if not self.gathered else [
            "__device__ __forceinline__ u32 gather_index(u32 j, u32 g, int logn) {",
            "    const u32 bj = __brev(j) >> (32 - logn);",
            "    const u32 e = (g * (2u * bj + 1u)) & ((2u << logn) - 1u);  // 2N divides 2^32: exact mod 2N",
            "    return __brev((e - 1u) >> 1) >> (32 - logn);",
            "}",
        ] + ([] if not GATHER_VECTOR else [
            "__device__ __forceinline__ u32 pick4(uint4 v, u32 k) {",
            "    return k == 0u ? v.x : k == 1u ? v.y : k == 2u ? v.z : v.w;",
            "}",
        ])

    def plain(self) -> tuple[int, ...]:
        """The vector operands read from memory as they are (neither gathered nor transformed)."""
        return tuple(k for k in range(self.n_vec) if k not in self.gathered and k not in self.transformed)

    def _body(self, skip: tuple[int, ...] = (), staged: tuple[int, ...] = (), scalar: bool = False) -> list[str]:
        """The kernel body after ``r``, ``i``, ``q`` and ``mu``: the operands' loads (:meth:`_loads`), the program and
        the stores. ``scalar``: one residue a thread (u32 values) at position ``j`` of the limb (point ``pe`` of the
        epilogue's stage), not the 4 of 16-byte word ``i``."""
        if scalar:
            return self._scalar_body(skip, staged)
        kinds = self.kinds()
        nv, ns, no = self.n_vec, self.n_scalar, len(self.outputs)
        lines = self._loads(skip, staged, False)
        # Scalar-only values are computed once; vector values once per component.
        for idx, op in enumerate(self.ops):
            v = nv + ns + idx
            if not kinds[v]:
                a, b = (f"x{op.args[0]}", f"x{op.args[-1]}")
                lines.append(f"    const u32 x{v} = {OPS[op.op][1].format(a=a, b=b)};")
        sums, hidden = self.lazy_sums() if LAZY_SUMS else ({}, frozenset())
        for v in range(nv + ns + len(self.ops)):
            if kinds[v] and v >= nv and v not in hidden:
                lines.append(f"    uint4 x{v};")
        for c in "xyzw":
            def arg(a: int) -> str:
                return f"x{a}.{c}" if kinds[a] else f"x{a}"

            for idx, op in enumerate(self.ops):
                v = nv + ns + idx
                if v in sums:
                    lines.append(f"    x{v}.{c} = {lazy_sum(sums[v], arg)};")
                elif kinds[v] and v not in hidden:
                    args = [arg(a) for a in op.args]
                    lines.append(f"    x{v}.{c} = {OPS[op.op][1].format(a=args[0], b=args[-1])};")
        for k, o in enumerate(self.outputs):
            lines.append(f"    ((uint4*)arena)[(u64)out_slots[r * {no} + {k}] * n4 + i] = x{o};")
        return lines

    def _scalar_body(self, skip: tuple[int, ...], staged: tuple[int, ...]) -> list[str]:
        """:meth:`_body` for one residue a thread: ``j`` its position in the limb, ``pe`` in the stage."""
        kinds = self.kinds()
        nv, ns, no = self.n_vec, self.n_scalar, len(self.outputs)
        lines = self._loads(skip, staged, True)
        sums, hidden = self.lazy_sums() if LAZY_SUMS else ({}, frozenset())

        def arg(a: int) -> str:
            return f"x{a}"

        for idx, op in enumerate(self.ops):
            v = nv + ns + idx
            if v in sums:
                lines.append(f"    const u32 x{v} = {lazy_sum(sums[v], arg)};")
            elif not kinds[v] or v not in hidden:
                lines.append(f"    const u32 x{v} = {OPS[op.op][1].format(a=arg(op.args[0]), b=arg(op.args[-1]))};")
        for k, o in enumerate(self.outputs):
            lines.append(f"    arena[(u64)out_slots[r * {no} + {k}] * (4u * (u32)n4) + j] = x{o};")
        return lines

    def _loads(self, skip: tuple[int, ...], staged: tuple[int, ...], scalar: bool) -> list[str]:
        """The vector operands' loads into ``x{k}`` (uint4, or u32 with ``scalar``; see :meth:`_body`) but those in
        ``skip``: a gathered one through its automorphism, one in ``staged`` from the epilogue's shared ``stage``, the
        others from memory; then the scalars'."""
        nv, ns = self.n_vec, self.n_scalar
        lines: list[str] = []
        for k in range(nv):
            if k in skip:
                continue
            if k in self.gathered:
                lines += self._gathered_load(k, scalar)
            elif k in staged:
                at = 1024 * staged.index(k)
                lines.append(f"    const u32 x{k} = stage[{at} + pe];" if scalar else
                             f"    const uint4 x{k} = *(const uint4*)(stage + {at} + 4 * e);")
            elif scalar:
                lines.append(f"    const u32 x{k} = arena[(u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4) + j];")
            else:
                lines.append(
                    f"    const uint4 x{k} = ((const uint4*)arena)[(u64)vec_slots[r * {nv} + {k}] * n4 + i];"
                )
        for k in range(ns):
            lines.append(f"    const u32 x{nv + k} = scalars[scalar_idx[r * {ns} + {k}]];")
        return lines

    def _gathered_load(self, k: int, scalar: bool) -> list[str]:
        """The load of gathered operand k (see the module docstring): one residue, or the 4 of word ``i``."""
        nv, ng, m = self.n_vec, len(self.gathered), self.gathered.index(k)
        if scalar:
            return [f"    const u32 x{k} = arena[(u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4) + "
                    f"gather_index((u32)j, (u32)galois[r * {ng} + {m}], logn)];"]
        lines = [
            f"    const u32* a{k} = arena + (u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4);",
            f"    const u32 g{k} = (u32)galois[r * {ng} + {m}];",
            f"    uint4 x{k};",
        ]
        if GATHER_VECTOR:  # the 4 sources share one aligned 16-byte word
            lines += [
                f"    const u32 s{k} = gather_index(4u * i, g{k}, logn);",
                f"    const uint4 w{k} = ((const uint4*)a{k})[s{k} >> 2];",
                f"    x{k}.x = pick4(w{k}, s{k} & 3u);",
            ]
            lines += [f"    x{k}.{c} = pick4(w{k}, gather_index(4u * i + {d}u, g{k}, logn) & 3u);"
                      for d, c in enumerate("xyzw") if d]
        else:
            lines += [f"    x{k}.{c} = a{k}[gather_index(4u * i + {d}u, g{k}, logn)];" for d, c in enumerate("xyzw")]
        return lines


def lazy_sum(terms, arg) -> str:
    """A C expression for the residue of the sum of ``terms`` (see :meth:`FusedProgram.lazy_sums`; ``arg(v)``: the
    C name of value v): a 64-bit accumulation reduced once every :data:`LAZY_TERMS` terms and at the end."""
    acc = ""
    for i, t in enumerate(terms):
        term = f"(u64){arg(t[0])} * {arg(t[1])}" if len(t) == 2 else f"(u64){arg(t[0])}"
        if i and i % LAZY_TERMS == 0:
            acc = f"(u64)reduce64({acc}, q, mu)"
        acc = f"{acc} + {term}" if acc else term
    return f"reduce64({acc}, q, mu)"


def epilogue_kernel(ring: CudaRing, program: FusedProgram):
    """(kernel, min blocks) of ``program``'s epilogue kernel (transformed operands, N >= 8192): compiled under the
    launch bounds of each of ``ntt.EPILOGUE_MIN_BLOCKS`` in turn whose blocks fit in shared memory, the first that
    needs no local memory (spills), else the last."""
    from caramel.backends.cuda import ntt

    lazy = ntt.ring_lazy(ring)
    name = program.kernel_name()
    for blocks in ntt.EPILOGUE_MIN_BLOCKS:
        if blocks != ntt.EPILOGUE_MIN_BLOCKS[-1] and not ntt.epilogue_fits(len(program.transformed), blocks):
            continue
        key = f"{name}-n{ring.n}-{int(lazy)}-b{blocks}-{ntt.epilogue_settings()}"  # all its source depends on
        kernel = ring.kernel(key, lambda b=blocks: program.source(ring.logn, lazy, b), name)
        if not kernel.local_size_bytes:
            break
    return kernel, blocks


def fused(
    ring: CudaRing, program: FusedProgram, arena, out_slots, vec_slots, prime_idx, scalars=None, scalar_idx=None,
    galois=None,
) -> None:
    """Run ``program`` over R rows (see the module docstring).

    out_slots: int32 (R, len(outputs)); vec_slots: int32 (R, n_vec); prime_idx: int32 (R,);
    scalars: uint32 device array (any length) and scalar_idx: int32 (R, n_scalar), when n_scalar > 0;
    galois: int32 (R, len(gathered)) odd Galois elements in [1, 2N), when the program gathers.
    """
    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    index_array(out_slots, rows, len(program.outputs), "out_slots")
    if program.n_vec:
        index_array(vec_slots, rows, program.n_vec, "vec_slots")
    if program.n_scalar:
        index_array(scalar_idx, rows, program.n_scalar, "scalar_idx")
        if scalars is None or scalars.dtype != cupy().uint32:
            raise ValueError("scalars must be a cupy uint32 array")
    if program.gathered:
        if galois is None:
            raise ValueError("a program with gathered operands needs galois")
        index_array(galois, rows, len(program.gathered), "galois")
    if rows == 0:
        return
    cp = cupy()
    dummy = prime_idx  # any device pointer for unused arguments
    n4 = ring.n // 4
    tiles = -(-n4 // THREADS)
    name = program.kernel_name()
    extra, smem = (), 0
    if program.transformed and ring.logn > 12:  # the epilogue kernel: its source depends on N
        from caramel.backends.cuda import ntt

        kernel, blocks = epilogue_kernel(ring, program)
        staged = ntt.epilogue_staged(program.transformed, program.plain(), blocks)
        extra = (ring.twiddles[0], ntt.warp_tables(ring, False, ntt.epilogue_split_from()))
        smem = ntt.epilogue_smem(len(program.transformed), len(staged))
        tiles //= ntt.epilogue_groups(len(program.transformed))  # a block takes G groups of 4 rows
        if kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
    else:
        kernel = ring.kernel(name, program.source, name)
    kernel(
        (rows * tiles,),
        (min(THREADS, n4),) if tiles == 1 else (THREADS,),
        (
            arena,
            vec_slots if program.n_vec else dummy,
            scalar_idx if program.n_scalar else dummy,
            out_slots,
            prime_idx,
            scalars if program.n_scalar else dummy,
            ring.prime_table,
            cp.int32(n4),
            cp.int32(tiles),
        ) + ((galois, cp.int32(ring.logn)) if program.gathered else ()) + extra,
        shared_mem=smem,
    )


# Fixed programs for the ISA's elementwise instructions.
ADD = FusedProgram(2, 0, (FusedOp("add", (0, 1)),), (2,))
SUB = FusedProgram(2, 0, (FusedOp("sub", (0, 1)),), (2,))
MUL = FusedProgram(2, 0, (FusedOp("mul", (0, 1)),), (2,))
NEG = FusedProgram(1, 0, (FusedOp("neg", (0,)),), (1,))
COPY = FusedProgram(1, 0, (), (0,))
ADD_SCALAR = FusedProgram(1, 1, (FusedOp("add", (0, 1)),), (2,))
SUB_SCALAR = FusedProgram(1, 1, (FusedOp("sub", (0, 1)),), (2,))
MUL_SCALAR = FusedProgram(1, 1, (FusedOp("mul", (0, 1)),), (2,))


def _binary(program):
    def run(ring: CudaRing, arena, out_slots, in_slots, prime_idx) -> None:
        fused(ring, program, arena, out_slots[:, None], in_slots, prime_idx)

    return run


def _unary(program):
    def run(ring: CudaRing, arena, out_slots, in_slots, prime_idx) -> None:
        fused(ring, program, arena, out_slots[:, None], in_slots[:, None], prime_idx)

    return run


def _scalar(program):
    def run(ring: CudaRing, arena, out_slots, in_slots, prime_idx, scalars, scalar_idx) -> None:
        fused(ring, program, arena, out_slots[:, None], in_slots[:, None], prime_idx, scalars, scalar_idx[:, None])

    return run


add = _binary(ADD)
add.__doc__ = "add(ring, arena, out_slots (R,), in_slots (R, 2), prime_idx (R,)): out = a + b mod q."
sub = _binary(SUB)
sub.__doc__ = "sub(ring, arena, out_slots (R,), in_slots (R, 2), prime_idx (R,)): out = a - b mod q."
mul = _binary(MUL)
mul.__doc__ = "mul(ring, arena, out_slots (R,), in_slots (R, 2), prime_idx (R,)): out = a * b mod q."
neg = _unary(NEG)
neg.__doc__ = "neg(ring, arena, out_slots (R,), in_slots (R,), prime_idx (R,)): out = -a mod q."
copy = _unary(COPY)
copy.__doc__ = "copy(ring, arena, out_slots (R,), in_slots (R,), prime_idx (R,)): out = a."
add_scalar = _scalar(ADD_SCALAR)
add_scalar.__doc__ = (
    "add_scalar(ring, arena, out_slots, in_slots, prime_idx, scalars, scalar_idx): out = a + scalars[scalar_idx[r]]."
)
sub_scalar = _scalar(SUB_SCALAR)
sub_scalar.__doc__ = (
    "sub_scalar(ring, arena, out_slots, in_slots, prime_idx, scalars, scalar_idx): out = a - scalars[scalar_idx[r]]."
)
mul_scalar = _scalar(MUL_SCALAR)
mul_scalar.__doc__ = (
    "mul_scalar(ring, arena, out_slots, in_slots, prime_idx, scalars, scalar_idx): out = a * scalars[scalar_idx[r]]."
)
