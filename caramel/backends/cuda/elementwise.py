"""Elementwise programs (:class:`caramel.expr.Expr`) as CUDA kernels over arena rows.

Every elementwise operation is an instance of one generated kernel family: one kernel per program, its source a
pure function of the program and the settings (:mod:`caramel.backends.cuda.config`), compiled once
(:mod:`caramel.backends.cuda.compiler`). A launch covers R rows: row r reads its operands from
``arena[vec_slots[r, i]]`` and ``scalars[scalar_idx[r, j]]`` and writes ``arena[out_slots[r, o]]``, all modulo
``q = primes[prime_idx[r]]``. Operands must be canonical residues; results are canonical. An output slot may equal
an input slot of the same row (each thread reads all its operands before it writes), but not a slot that another
row reads.

Each thread handles 4 consecutive residues (16-byte loads and stores). Sums of products reduce once
(:func:`lazy_sums`): a vector ``add`` whose operand tree holds products is one 64-bit accumulation and one Barrett
reduction instead of a reduction per operation. A *gathered* operand (``Expr.gathered``: an automorphism computed
in the load) is read at the permuted index instead: x[j] = row[br(((g (2 br(j) + 1)) mod 2N - 1) / 2)], g =
``galois[r, m]`` (the formula of :mod:`caramel.backends.cuda.automorphism`). An aligned block of 2^t outputs reads
exactly one aligned block of 2^t inputs; for t = 2 that is a thread's own 4 outputs: j = 4i + d moves only the top
two bits of g (2 br(j) + 1) mod 2N (by d' g mod 4, d' = br_2(d), a bijection for g odd), hence only the low two
bits of the source. So each thread loads the one aligned 16-byte word holding its 4 sources and permutes its
components, and a warp's loads cover 512 contiguous bytes as a plain operand's do. A gathered operand's slot must
not be an output slot of the launch. With *transformed* operands (``Expr.transformed``) at N >= 8192 the kernel is
an NTT epilogue (:mod:`caramel.backends.cuda.ntt.epilogue`).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from types import MappingProxyType

from caramel.backends.cuda.compiler import function
from caramel.backends.cuda.config import EpilogueConfig, KernelConfig
from caramel.backends.cuda.context import COMMON_SRC, CudaRing, cupy, index_array
from caramel.backends.cuda.ntt import epilogue as epi
from caramel.backends.cuda.ntt.common import ring_lazy
from caramel.backends.cuda.ntt.tables import split_stage, warp_tables
from caramel.expr import Expr, ExprOp

#: Terms a 64-bit accumulator takes between two reductions: a term is a product of two residues (< 2^60, as the
#: kernels need q < 2^30) or a residue, so a reduced value plus 15 terms stays below 2^30 + 15 * 2^60 < 2^64.
LAZY_TERMS = 15

#: Operation name -> C expression template over a, b, q, mu.
OPS = MappingProxyType({
    "add": "add_mod({a}, {b}, q)",
    "sub": "sub_mod({a}, {b}, q)",
    "mul": "mul_mod({a}, {b}, q, mu)",
    "neg": "neg_mod({a}, q)",
})


def kernel_name(expr: Expr) -> str:
    """The kernel's name: ``fused_`` and 16 hex digits of the SHA-1 of the program's text."""
    return "fused_" + hashlib.sha1(expr.text().encode()).hexdigest()[:16]


def lazy_sums(expr: Expr) -> tuple[dict[int, tuple[tuple[int, ...], ...]], frozenset[int]]:
    """The vector sums that reduce once, and the values they hide. Sums: value v -> its terms, each ``(a, b)`` (the
    product a b) or ``(a,)`` (the value a), v = sum of the terms mod q. A vector ``add`` absorbs each of its operands
    that is a vector ``add`` or ``mul`` read only there (not an output), recursively; an add that is not absorbed
    itself is a sum when its terms hold a product, and hides what it absorbed (no code of their own). Exact: the
    residue of the exact sum is what the chain of ``add_mod`` and ``mul_mod`` computes."""
    kinds = expr.kinds()
    base = expr.n_vec + expr.n_scalar
    ops = {base + i: op for i, op in enumerate(expr.ops)}
    uses = [0] * (base + len(expr.ops))
    for a in [a for op in expr.ops for a in op.args] + list(expr.outputs):
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


def lazy_sum(terms, arg) -> str:
    """A C expression for the residue of the sum of ``terms`` (see :func:`lazy_sums`; ``arg(v)``: the C name of value
    v): a 64-bit accumulation reduced once every :data:`LAZY_TERMS` terms and at the end."""
    acc = ""
    for i, t in enumerate(terms):
        term = f"(u64){arg(t[0])} * {arg(t[1])}" if len(t) == 2 else f"(u64){arg(t[0])}"
        if i and i % LAZY_TERMS == 0:
            acc = f"(u64)reduce64({acc}, q, mu)"
        acc = f"{acc} + {term}" if acc else term
    return f"reduce64({acc}, q, mu)"


def _gather_helpers(expr: Expr) -> list[str]:
    """The device functions of gathered operands (none without)."""
    return [] if not expr.gathered else [
        "__device__ __forceinline__ u32 gather_index(u32 j, u32 g, int logn) {",
        "    const u32 bj = __brev(j) >> (32 - logn);",
        "    const u32 e = (g * (2u * bj + 1u)) & ((2u << logn) - 1u);  // 2N divides 2^32: exact mod 2N",
        "    return __brev((e - 1u) >> 1) >> (32 - logn);",
        "}",
        "__device__ __forceinline__ u32 pick4(uint4 v, u32 k) {",
        "    return k == 0u ? v.x : k == 1u ? v.y : k == 2u ? v.z : v.w;",
        "}",
    ]


def _gather_params(expr: Expr) -> str:
    return ", const int* __restrict__ galois, int logn" if expr.gathered else ""


def _body(expr: Expr, skip: tuple[int, ...] = (), staged: tuple[int, ...] = (), scalar: bool = False) -> list[str]:
    """The kernel body after ``r``, ``i``, ``q`` and ``mu``: the operands' loads (:func:`_loads`), the program and the
    stores. ``scalar``: one residue a thread (u32 values) at position ``j`` of the limb (point ``pe`` of the
    epilogue's stage), not the 4 of 16-byte word ``i``."""
    kinds = expr.kinds()
    nv, ns, no = expr.n_vec, expr.n_scalar, len(expr.outputs)
    lines = _loads(expr, skip, staged, scalar)
    sums, hidden = lazy_sums(expr)
    if scalar:
        def name(a: int) -> str:
            return f"x{a}"

        for idx, op in enumerate(expr.ops):
            v = nv + ns + idx
            if v in sums:
                lines.append(f"    const u32 x{v} = {lazy_sum(sums[v], name)};")
            elif not kinds[v] or v not in hidden:
                lines.append(f"    const u32 x{v} = {OPS[op.op].format(a=name(op.args[0]), b=name(op.args[-1]))};")
        lines += [f"    arena[(u64)out_slots[r * {no} + {k}] * (4u * (u32)n4) + j] = x{o};"
                  for k, o in enumerate(expr.outputs)]
        return lines
    # Scalar-only values are computed once; vector values once per component.
    for idx, op in enumerate(expr.ops):
        v = nv + ns + idx
        if not kinds[v]:
            lines.append(f"    const u32 x{v} = {OPS[op.op].format(a=f'x{op.args[0]}', b=f'x{op.args[-1]}')};")
    for v in range(nv + ns + len(expr.ops)):
        if kinds[v] and v >= nv and v not in hidden:
            lines.append(f"    uint4 x{v};")
    for c in "xyzw":
        def arg(a: int) -> str:
            return f"x{a}.{c}" if kinds[a] else f"x{a}"

        for idx, op in enumerate(expr.ops):
            v = nv + ns + idx
            if v in sums:
                lines.append(f"    x{v}.{c} = {lazy_sum(sums[v], arg)};")
            elif kinds[v] and v not in hidden:
                lines.append(f"    x{v}.{c} = {OPS[op.op].format(a=arg(op.args[0]), b=arg(op.args[-1]))};")
    lines += [f"    ((uint4*)arena)[(u64)out_slots[r * {no} + {k}] * n4 + i] = x{o};" for k, o in enumerate(expr.outputs)]
    return lines


def _loads(expr: Expr, skip: tuple[int, ...], staged: tuple[int, ...], scalar: bool) -> list[str]:
    """The vector operands' loads into ``x{k}`` (uint4, or u32 with ``scalar``; see :func:`_body`) but those in
    ``skip``: a gathered one through its automorphism, one in ``staged`` from the epilogue's shared ``stage``, the
    others from memory; then the scalars'."""
    nv, ns = expr.n_vec, expr.n_scalar
    lines: list[str] = []
    for k in range(nv):
        if k in skip:
            continue
        if k in expr.gathered:
            lines += _gathered_load(expr, k, scalar)
        elif k in staged:
            at = 1024 * staged.index(k)
            lines.append(f"    const u32 x{k} = stage[{at} + pe];" if scalar else
                         f"    const uint4 x{k} = *(const uint4*)(stage + {at} + 4 * e);")
        elif scalar:
            lines.append(f"    const u32 x{k} = arena[(u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4) + j];")
        else:
            lines.append(f"    const uint4 x{k} = ((const uint4*)arena)[(u64)vec_slots[r * {nv} + {k}] * n4 + i];")
    lines += [f"    const u32 x{nv + k} = scalars[scalar_idx[r * {ns} + {k}]];" for k in range(ns)]
    return lines


def _gathered_load(expr: Expr, k: int, scalar: bool) -> list[str]:
    """The load of gathered operand k (see the module docstring): one residue, or the 4 of word ``i`` from the one
    aligned 16-byte word that holds them."""
    nv, ng, m = expr.n_vec, len(expr.gathered), expr.gathered.index(k)
    if scalar:
        return [f"    const u32 x{k} = arena[(u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4) + "
                f"gather_index((u32)j, (u32)galois[r * {ng} + {m}], logn)];"]
    return [
        f"    const u32* a{k} = arena + (u64)vec_slots[r * {nv} + {k}] * (4u * (u32)n4);",
        f"    const u32 g{k} = (u32)galois[r * {ng} + {m}];",
        f"    uint4 x{k};",
        f"    const u32 s{k} = gather_index(4u * i, g{k}, logn);",
        f"    const uint4 w{k} = ((const uint4*)a{k})[s{k} >> 2];",
        f"    x{k}.x = pick4(w{k}, s{k} & 3u);",
    ] + [f"    x{k}.{c} = pick4(w{k}, gather_index(4u * i + {d}u, g{k}, logn) & 3u);" for d, c in enumerate("xyzw") if d]


@lru_cache(maxsize=None)
def plain_source(expr: Expr, threads: int = 256) -> str:
    """CUDA source of ``expr``'s plain kernel (blocks of ``threads`` threads, 4 residues each; transformed operands
    are read as they are: below N = 8192 the transform runs whole)."""
    lines = _gather_helpers(expr) + [
        f'extern "C" __global__ void __launch_bounds__({threads}) {kernel_name(expr)}(',
        "        u32* arena, const int* __restrict__ vec_slots, const int* __restrict__ scalar_idx,",
        "        const int* __restrict__ out_slots, const int* __restrict__ prime_idx,",
        "        const u32* __restrict__ scalars, const u32* __restrict__ pt, int n4, int tiles"
        + _gather_params(expr) + ") {",
        "    const int r = blockIdx.x / tiles;",
        "    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;",
        "    if (i >= n4) return;",
        "    const int pi = prime_idx[r];",
        "    const u32 q = prime_q(pt, pi);",
        "    const u64 mu = prime_mu(pt, pi);",
        "    (void)mu;",
    ] + _body(expr) + ["}"]
    return COMMON_SRC + "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def epilogue_sources(expr: Expr, logn: int, lazy: bool, config: EpilogueConfig = EpilogueConfig()
                     ) -> tuple[tuple[int, str], ...]:
    """(min blocks, CUDA source) of ``expr``'s epilogue kernel (N = 2^logn >= 8192) under each launch bound of
    ``config.min_blocks`` that :func:`epilogue_kernel` may take, in its order: those whose blocks fit in shared
    memory, and the last."""
    out = []
    for blocks in config.min_blocks:
        if blocks != config.min_blocks[-1] and not epi.epilogue_fits(len(expr.transformed), blocks, config):
            continue
        staged = epi.epilogue_staged(expr.transformed, expr.plain(), blocks, config)
        scalar = epi.epilogue_scalar(len(expr.transformed), config)
        body = "\n".join("        " + line for line in _body(expr, expr.transformed, staged, scalar))
        out.append((blocks, epi.epilogue_source(logn, kernel_name(expr), expr.transformed, expr.n_vec, body, lazy,
                                                _gather_params(expr), blocks, staged, config,
                                                "\n".join(_gather_helpers(expr)))))
    return tuple(out)


def epilogue_kernel(ring: CudaRing, expr: Expr, config: EpilogueConfig = EpilogueConfig()):
    """(kernel, min blocks) of ``expr``'s epilogue kernel (transformed operands, N >= 8192): the first of
    :func:`epilogue_sources` that needs no local memory (spills), else the last."""
    for blocks, source in epilogue_sources(expr, ring.logn, ring_lazy(ring), config):
        kernel = function(source, kernel_name(expr))
        if not kernel.local_size_bytes:
            break
    return kernel, blocks


def fused(ring: CudaRing, expr: Expr, arena, out_slots, vec_slots, prime_idx, scalars=None, scalar_idx=None,
          galois=None, kernels: KernelConfig | None = None) -> None:
    """Run ``expr`` over R rows (see the module docstring) under ``kernels`` (default ``KernelConfig()``).

    out_slots: int32 (R, len(outputs)); vec_slots: int32 (R, n_vec); prime_idx: int32 (R,);
    scalars: uint32 device array (any length) and scalar_idx: int32 (R, n_scalar), when n_scalar > 0;
    galois: int32 (R, len(gathered)) odd Galois elements in [1, 2N), when the program gathers.
    """
    config = kernels or KernelConfig()
    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    index_array(out_slots, rows, len(expr.outputs), "out_slots")
    if expr.n_vec:
        index_array(vec_slots, rows, expr.n_vec, "vec_slots")
    if expr.n_scalar:
        index_array(scalar_idx, rows, expr.n_scalar, "scalar_idx")
        if scalars is None or scalars.dtype != cupy().uint32:
            raise ValueError("scalars must be a cupy uint32 array")
    if expr.gathered:
        if galois is None:
            raise ValueError("a program with gathered operands needs galois")
        index_array(galois, rows, len(expr.gathered), "galois")
    if rows == 0:
        return
    cp = cupy()
    dummy = prime_idx  # any device pointer for unused arguments
    n4 = ring.n // 4
    extra, smem = (), 0
    if expr.transformed and ring.logn > 12:  # the epilogue kernel: 256 threads, G groups of 4 rows (1024 residues)
        kernel, blocks = epilogue_kernel(ring, expr, config.epilogue)
        f = len(expr.transformed)
        staged = epi.epilogue_staged(expr.transformed, expr.plain(), blocks, config.epilogue)
        extra = (ring.twiddles[0], warp_tables(ring, False, split_stage(config.epilogue.split_from)))
        smem = epi.epilogue_smem(f, config.epilogue, len(staged))
        threads, tiles = 32 * epi.EPILOGUE_WARPS, n4 // 256 // epi.epilogue_groups(f)
        if kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
    else:
        threads = config.elementwise.threads
        kernel = function(plain_source(expr, threads), kernel_name(expr))
        tiles = -(-n4 // threads)
    kernel(
        (rows * tiles,),
        (min(threads, n4),) if tiles == 1 else (threads,),
        (
            arena,
            vec_slots if expr.n_vec else dummy,
            scalar_idx if expr.n_scalar else dummy,
            out_slots,
            prime_idx,
            scalars if expr.n_scalar else dummy,
            ring.prime_table,
            cp.int32(n4),
            cp.int32(tiles),
        ) + ((galois, cp.int32(ring.logn)) if expr.gathered else ()) + extra,
        shared_mem=smem,
    )


# Fixed programs for the ISA's elementwise instructions.
ADD = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,))
SUB = Expr(2, 0, (ExprOp("sub", (0, 1)),), (2,))
MUL = Expr(2, 0, (ExprOp("mul", (0, 1)),), (2,))
NEG = Expr(1, 0, (ExprOp("neg", (0,)),), (1,))
COPY = Expr(1, 0, (), (0,))
ADD_SCALAR = Expr(1, 1, (ExprOp("add", (0, 1)),), (2,))
SUB_SCALAR = Expr(1, 1, (ExprOp("sub", (0, 1)),), (2,))
MUL_SCALAR = Expr(1, 1, (ExprOp("mul", (0, 1)),), (2,))


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
