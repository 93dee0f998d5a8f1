"""Kernel variants side by side, one command on a GPU machine: every variant is first checked
bit-exact against the CPU reference on fresh random data, then timed (CUDA graph of launches over
rotating input sets, median of replays; see scripts/gpu_kernels_check.py's Bench).

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_variants.py [--sizes 4096,8192,65536] [--quick]

NTT/INTT variants: the warp-tile row kernel's warps a block and split stages, lazy or not; a
loads-and-stores only variant gives the floor of the access pattern, constant twiddles the price of
the twiddle loads. Base conversion: the tensor-core kernel's builds
(TC_VARIANTS) against the tiled one, in the three modes, at the shapes of BootstrapLike_51L_1c;
--bc-before FILE beside them another basis.py's default kernel, --bc-floor the access patterns alone.
Prints a table last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from gpu_kernels_check import Bench, sets_for  # noqa: E402

#: Keyword arguments of caramel.backends.cuda.ntt._launch, one dict a variant of the NTT kernels (the
#: others at their module defaults). The second is the default of session 8 (4 warps a block); the
#: block row kernel and the one-pass kernels of the variants of sessions 4-8 were removed after session 8.
DEFAULT = dict(split_from=(5, 5), lazy=True, warps=4, load_cg=True, first_cs=True, second_reversed=True)
NTT_VARIANTS = [
    dict(DEFAULT, warps=1), DEFAULT, dict(DEFAULT, warps=2), dict(DEFAULT, warps=8), dict(DEFAULT, split_from=(6, 6)),
    dict(DEFAULT, split_from=(4, 4)), dict(DEFAULT, split_from=(7, 7)), dict(DEFAULT, lazy=False),
    dict(DEFAULT, load_cg=False),  # 8: plain data loads (L1 allocating) instead of ld.global.cg
    # 9-11: the first pass's input loads evict-first and the second pass's limbs in reverse order: neither (the
    # kernels of session 9), the reverse order alone, the evict-first loads alone
    dict(DEFAULT, first_cs=False, second_reversed=False), dict(DEFAULT, first_cs=False),
    dict(DEFAULT, second_reversed=False),
]
#: Timing only (wrong results): the loads and stores alone, and constant twiddles (no twiddle loads).
TIMING_ONLY = [dict(DEFAULT, body=False), dict(DEFAULT, tw_fake=True)]


def label(kw: dict) -> str:
    """A variant's settings that differ from the default."""
    return " ".join(f"{k}={v}" for k, v in kw.items() if DEFAULT.get(k) != v) or "default"


#: (S, D, B) of base conversions that BootstrapLike_51L_1c runs (with their counts there).
BC_SHAPES = [(13, 50, 1), (13, 50, 3), (16, 47, 2), (21, 42, 1), (15, 45, 4), (3, 52, 2), (20, 40, 2), (19, 38, 3)]
#: Builds of the tensor-core base conversion (BaseConversion.convert's build: unroll, minb); the
#: first (None) is the default, basis.tc_build's pick.
TC_VARIANTS = [dict(build=None), dict(build=(1, 6)), dict(build=(2, 4))]


def tc_label(kw: dict) -> str:
    """A tensor-core build's settings."""
    return "default" if kw["build"] is None else "unroll {}, minb {}".format(*kw["build"])


#: Shapes timed only with --bc-extra (not in BootstrapLike_51L_1c): large S, small D.
BC_EXTRA = [(60, 4, 1), (40, 24, 1), (55, 9, 2)]
#: Shapes timed only with --bc-probe: the input phase alone (D = 1, 8) and the output phase alone (S = 1).
BC_PROBE = [(13, 1, 1), (13, 8, 1), (1, 50, 1), (1, 8, 1)]
#: --bc-floor (timing only, wrong results): bc_floor has the tensor-core conversion's grid and accesses (a
#: thread's S 4-byte loads, a lane's 16-byte stores of two outputs of every 8) and no arithmetic;
#: write_only / read_only stream 16-byte words over 256 MiB (the two directions' ceilings).
FLOOR_SRC = r"""
template <int C> __device__ __forceinline__ unsigned load_c(const unsigned* p) {
    if (C == 4) { const uint4 v = *(const uint4*)p; return v.x ^ v.y ^ v.z ^ v.w; }
    return *p;
}
// Block (b, tile): blockDim.x * C coefficients, C a thread. MMA = 1: the tensor-core kernel's stores (C = 1, a
// lane's 16-byte store at coefficient 4 g of its warp for outputs 2 t + h of every 8); MMA = 0: row by row,
// a thread's C words of each output.
template <int C, int MMA> __device__ void floor_body(unsigned* arena, const int* ins, const int* outs, int S, int D,
                                                    int n, int tiles) {
    const int tile = blockIdx.x % tiles, b = blockIdx.x / tiles;
    const size_t base = (size_t)tile * blockDim.x * C;
    unsigned x = 0;
#pragma unroll 8
    for (int k = 0; k < S; ++k) x ^= load_c<C>(arena + (size_t)ins[b * S + k] * n + base + C * threadIdx.x);
    const unsigned y = __shfl_xor_sync(~0u, x, 1);
    if (MMA) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        unsigned* dst = arena + base + (threadIdx.x & ~31) + 4 * g;
        for (int d0 = 0; d0 < D; d0 += 8)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int d = d0 + 2 * t + h;
                if (d < D) *(uint4*)(dst + (size_t)outs[b * D + d] * n) = make_uint4(x, y, x + d, y ^ d);
            }
    } else {
        for (int d = 0; d < D; ++d) {
            unsigned* dst = arena + (size_t)outs[b * D + d] * n + base + C * threadIdx.x;
            if (C == 4) *(uint4*)dst = make_uint4(x, y, x + d, y ^ d); else *dst = x + d;
        }
    }
}
#define FLOOR(NAME, C, MMA) extern "C" __global__ void NAME(unsigned* a, const int* i, const int* o, int S, int D, \
    int n, int tiles) { floor_body<C, MMA>(a, i, o, S, D, n, tiles); }
FLOOR(bc_floor, 1, 1)
FLOOR(floor_rows1, 1, 0)
FLOOR(floor_rows4, 4, 0)
extern "C" __global__ void write_only(uint4* a, size_t words) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        a[i] = make_uint4(i, 1, 2, 3);
}
extern "C" __global__ void read_only(const uint4* a, size_t words, unsigned* sink) {
    unsigned x = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = a[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u) sink[0] = x;
}
"""
#: (kernel, threads a block, coefficients a thread) of --bc-floor: the conversion's pattern, then rows of 4-byte
#: and 16-byte words with 128 to 2048 coefficients a block.
FLOOR_VARIANTS = [("bc_floor", 128, 1), ("floor_rows1", 128, 1), ("floor_rows1", 512, 1), ("floor_rows4", 32, 4),
                  ("floor_rows4", 128, 4), ("floor_rows4", 256, 4), ("floor_rows4", 512, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,8192,65536")
    ap.add_argument("--n", type=int, default=65536, help="ring degree of the timings")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--more-rows", default="40", help="further NTT batch sizes to time (comma separated)")
    ap.add_argument("--ntt-only", action="store_true", help="leave out base conversion")
    ap.add_argument("--bc-only", action="store_true", help="leave out the NTT timings (its checks stay)")
    ap.add_argument("--bc-extra", action="store_true", help="also time BC_EXTRA")
    ap.add_argument("--bc-probe", action="store_true", help="also time BC_PROBE")
    ap.add_argument("--bc-before", action="append", default=[],
                    help="also time the default kernel of this other basis.py (e.g. a commit's; repeatable)")
    ap.add_argument("--bc-floor", action="store_true",
                    help="also time FLOOR_VARIANTS and the one-way ceilings (timing only)")
    ap.add_argument("--ntt-variants", default="", help="indices into NTT_VARIANTS (comma separated; default all)")
    args = ap.parse_args()
    variants = ([NTT_VARIANTS[int(i)] for i in args.ntt_variants.split(",")] if args.ntt_variants
                else list(NTT_VARIANTS))
    import cupy as cp

    from caramel.backends.cuda import CudaRing
    from caramel.backends.cuda import basis as dbasis
    from caramel.backends.cuda import ntt as dntt
    from caramel.ring import Context, Mode

    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"device {props['name'].decode()} date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    failures: list[str] = []
    rings = {}

    def ring_of(n):
        if n not in rings:
            t0 = time.time()
            ctx = Context(n)
            ring = CudaRing(ctx)
            ring.twiddles
            rings[n] = (ctx, ring)
            print(f"tables N={n}: {time.time() - t0:.1f} s", flush=True)
        return rings[n]

    def i32(a):
        return cp.asarray(np.ascontiguousarray(np.asarray(a, dtype=np.int32)))

    def residues(ctx, limbs):
        return np.stack([rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64) for l in limbs]).astype(np.uint32)

    # 1. bit-exactness of every NTT variant (all 64 primes, fresh data, poisoned outputs)
    for n in [int(x) for x in args.sizes.split(",")]:
        ctx, ring = ring_of(n)
        limbs = list(range(64)) if n <= 8192 else list(rng.permutation(64)[:12])
        x = residues(ctx, limbs)
        want_f = ctx.ntt(x, limbs)
        want_i = ctx.intt(x, limbs)
        rows = len(limbs)
        for kw in list(variants):
            for inverse, want in ((False, want_f), (True, want_i)):
                try:
                    arena = cp.asarray(np.concatenate([x, np.full_like(x, 0xFFFFFFFF)]))
                    dntt._launch(ring, arena, i32(range(rows)), i32(range(rows, 2 * rows)), i32(limbs), inverse,
                                 **kw)
                    ok = np.array_equal(cp.asnumpy(arena[rows:]), want)
                    arena = cp.asarray(x)  # in place as well
                    dntt._launch(ring, arena, i32(range(rows)), i32(range(rows)), i32(limbs), inverse, **kw)
                    ok = ok and np.array_equal(cp.asnumpy(arena), want)
                except Exception as exc:  # a variant that does not compile or launch: report it, time the rest
                    print(f"{label(kw)}: {type(exc).__name__}: {exc}", flush=True)
                    ok = False
                if not ok:
                    failures.append(f"{'intt' if inverse else 'ntt'} N={n} {label(kw)}")
                    if kw in variants:
                        variants.remove(kw)
        print(f"NTT checks N={n}: {'ok' if not failures else failures}", flush=True)

    # 2. bit-exactness of both base conversion kernels, all modes
    for n in () if args.ntt_only else (4096, args.n):
        ctx, ring = ring_of(n)
        for s, d, _ in BC_SHAPES[:3] + [(1, 3, 1), (40, 24, 1), (20, 40, 1), (55, 9, 1), (5, 8, 1)]:
            perm = [int(v) for v in rng.permutation(64)]
            in_limbs, out_limbs = sorted(perm[:s]), sorted(perm[s : s + d])
            convs = {t: dbasis.BaseConversion(ring, in_limbs, out_limbs, tensor=t) for t in (True, False)}
            ref = ctx.base_converter(in_limbs, out_limbs)
            xs = [residues(ctx, in_limbs) for _ in range(2)]
            for mode in Mode:
                want = [ref.convert(x, mode) for x in xs]
                # batch 2, the second in place (its first min(S, D) outputs overwrite its inputs; the
                # tensor-core kernel only)
                for tensor, kw in [(False, {})] + [(True, kw) for kw in TC_VARIANTS]:
                    arena = cp.asarray(np.concatenate(xs + [np.full((2 * d, n), 0xFFFFFFFF, np.uint32)]))
                    outs = np.arange(2 * d).reshape(2, d) + 2 * s
                    if tensor:
                        outs[1, : min(s, d)] = np.arange(s, 2 * s)[: min(s, d)]
                    convs[tensor].convert(arena, i32(np.arange(2 * s).reshape(2, s)), i32(outs), mode, **kw)
                    have = cp.asnumpy(arena)
                    for b in range(2):
                        if not np.array_equal(have[outs[b]], want[b]):
                            failures.append(f"baseconv N={n} S={s} D={d} {mode.value} "
                                            f"{tc_label(kw) if tensor else 'tiled'} batch {b}")
        print(f"base conversion checks N={n}: {'ok' if not failures else failures}", flush=True)

    # 3. timings at N = args.n
    n = args.n
    ctx, ring = ring_of(n)
    bench = Bench(cp, n)
    limb = 4 * n
    big = cp.asarray(rng.integers(0, 2**28, (1024, n), dtype=np.uint32))
    big2 = cp.empty_like(big)
    t = bench.time(lambda s: big2.__setitem__(Ellipsis, big), 1, per_replay=8)
    copy = 2 * big.nbytes / t
    bench.add("device copy (ceiling)", "256 MiB", t, f"{copy / 1e9:8.0f} GB/s")
    del big, big2
    ntt_rows = [args.rows] + [int(r) for r in args.more_rows.split(",") if r]
    rows = max(ntt_rows)
    sets = sets_for(2 * rows * limb)
    arena = cp.asarray(rng.integers(0, 2**28, (2 * rows * sets, n), dtype=np.uint32))
    primes = i32(np.arange(rows) % 64)
    ins = [i32(np.arange(rows) + 2 * rows * s) for s in range(sets)]
    outs = [i32(np.arange(rows) + 2 * rows * s + rows) for s in range(sets)]
    two_pass = copy / (4 * limb)  # two passes: each reads and writes the limb once
    print(f"two-pass bound at the copy rate: {two_pass / 1e6:.2f} M limbs/s", flush=True)
    for kw in [] if args.bc_only else variants + (TIMING_ONLY if variants else []):
        for fname, inverse in (("ntt", False), ("intt", True)):
            for r in ntt_rows:  # a large batch, the plan's mid sizes, the typical size of its INTT launches
                try:
                    t = bench.time(lambda s: dntt._launch(ring, arena, ins[s][:r], outs[s][:r], primes[:r], inverse,
                                                          **kw), sets)
                except Exception as exc:
                    print(f"{fname} {label(kw)} R={r}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                bench.add(f"{fname} {label(kw)}", f"R={r}", t,
                          f"{r / t / 1e6:6.2f} M limbs/s {r / t / two_pass * 100:5.1f}% of its bound")
        if ring.logn > 12 and kw.get("body", True):  # the forward kernels one by one
            tw, pt = ring.twiddles[0], ring.prime_table
            key = "ntt-var-" + "-".join(map(str, kw.values()))
            src_kw = {k: kw[k] for k in ("split_from", "lazy", "tw_fake", "warps", "load_cg", "first_cs",
                                          "second_reversed") if k in kw}
            warps, sf = kw["warps"], dntt.warp_split_from(kw["split_from"], False)
            for kname, blocks in (("ntt_fwd_col", 256 // dntt.COLS), ("ntt_fwd_row", (n >> 8) // (4 * warps))):
                k = ring.kernel(key, lambda: dntt._source(ring.logn, **src_kw), kname)
                row = kname.endswith("_row")
                smem = dntt.warp_smem(warps, sf) if row else 0
                if k.max_dynamic_shared_size_bytes < smem:
                    k.max_dynamic_shared_size_bytes = smem
                extra = (dntt.warp_tables(ring, False, sf),) if row else ()
                t = bench.time(lambda s: k((rows * blocks,), (32 * warps if row else dntt.THREADS,),
                                           (arena, ins[s], outs[s], primes, pt, tw) + extra, shared_mem=smem), sets)
                bench.add(f"  {kname}", f"R={rows}", t, f"{2 * rows * limb / t / copy * 100:5.1f}% of copy")
    del arena
    before = {}
    for path in args.bc_before:  # each on its own ring: the module cache is keyed by names that the files share
        import importlib.util
        spec = importlib.util.spec_from_file_location(f"basis_before_{len(before)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        before[os.path.basename(path)] = (module, CudaRing(ctx))
    floor = cp.RawModule(code=FLOOR_SRC) if args.bc_floor and not args.ntt_only else None
    if floor is not None:
        big = cp.empty((1 << 28) // 4, dtype=np.uint32)
        sink = cp.zeros(1, dtype=np.uint32)
        words, grid = np.uint64(big.size // 4), (4 * 132 * 8,)
        for kname, extra in (("write_only", ()), ("read_only", (sink,))):
            k = floor.get_function(kname)
            t = bench.time(lambda s: k(grid, (256,), (big, words) + extra), 1, per_replay=8)
            bench.add(f"{kname} (ceiling)", "256 MiB", t, f"{big.nbytes / t / 1e9:8.0f} GB/s")
        del big
    for s_in, d_out, batch in [] if args.ntt_only else BC_SHAPES + (BC_EXTRA if args.bc_extra else []) + (
            BC_PROBE if args.bc_probe else []):
        perm = list(range(64))
        convs = {t: dbasis.BaseConversion(ring, perm[:s_in], perm[s_in : s_in + d_out], tensor=t)
                 for t in (True, False)}
        kinds = [("tiled", False, {})] + [("tensor " + tc_label(kw), True, kw) for kw in TC_VARIANTS]
        for name, (module, ring_before) in before.items():
            convs[name] = module.BaseConversion(ring_before, perm[:s_in], perm[s_in : s_in + d_out])
            kinds.insert(1, (f"{name} (default)", name, {}))
        per = batch * (s_in + d_out)
        sets = sets_for(per * limb)
        arena = cp.asarray(rng.integers(0, 2**20, (per * sets, n), dtype=np.uint32))
        bins = [i32(np.arange(batch * s_in).reshape(batch, s_in) + per * s) for s in range(sets)]
        bouts = [i32(np.arange(batch * d_out).reshape(batch, d_out) + per * s + batch * s_in) for s in range(sets)]
        for mode in ((Mode.EXACT,) if (s_in, d_out, batch) != BC_SHAPES[0] else tuple(Mode)):
            for name, key, kw in kinds:
                t = bench.time(lambda s: convs[key].convert(arena, bins[s], bouts[s], mode, **kw), sets)
                rate = batch * s_in * d_out * n / t / 1e12
                bench.add(f"baseconv {mode.value} {name}",
                          f"S={s_in} D={d_out} B={batch}", t, f"{per * limb / t / copy * 100:5.1f}% of copy  {rate:5.2f} TMAC/s")
        for kname, threads, c in FLOOR_VARIANTS if floor is not None else ():
            k, tiles = floor.get_function(kname), n // (threads * c)
            args_of = (lambda s: (arena, bins[s], bouts[s], np.int32(s_in), np.int32(d_out), np.int32(n),
                                  np.int32(tiles)))
            t = bench.time(lambda s: k((batch * tiles,), (threads,), args_of(s)), sets)
            bench.add(f"baseconv floor {kname} {threads}x{c}", f"S={s_in} D={d_out} B={batch}", t,
                      f"{per * limb / t / copy * 100:5.1f}% of copy")
        del arena
    return bench.report(("kernel", "config", "us", "rate"), failures)


if __name__ == "__main__":
    sys.exit(main())
