"""Check every CUDA kernel against the CPU reference, then time them; one command on a GPU machine.

    PYTHONUNBUFFERED=1 python3 scripts/gpu_kernels_check.py [--no-tests] [--no-bench] [--n 65536]

1. Runs tests/backends/test_cuda_kernels.py (bit-exact comparison with caramel.ring at N = 4096 and
   65536 on fresh random data).
2. Times the kernels at N (default 65536): each measurement captures a CUDA graph of many launches
   over rotating input sets (so that neither host launch overhead nor the L2 cache flatters the
   result), replays it after a warm-up and reports the median of the replays (device events).
   A plain device-to-device copy gives the memory-bandwidth ceiling for comparison.
Prints a table at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SET_BYTES = 512 << 20  # the data of all rotating sets together: well above the 60 MB L2


def run_tests() -> int:
    import pytest

    return int(pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(ROOT, "tests/backends/test_cuda_kernels.py")]))


class Bench:
    def __init__(self, cp, n: int):
        self.cp = cp
        self.n = n
        self.rows: list[tuple[str, str, float, str]] = []

    def time(self, launch, sets: int, per_replay: int = 0, reps: int = 15) -> float:
        """Median seconds of one launch(set) call: a graph of launches over all sets, replayed."""
        cp = self.cp
        per_replay = per_replay or max(sets, 8)
        for s in range(sets):  # warm-up: compile, upload tables
            launch(s)
        cp.cuda.Device().synchronize()
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            for k in range(per_replay):
                launch(k % sets)
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            graph.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / per_replay)
        return statistics.median(times)

    def add(self, name: str, config: str, seconds: float, rate: str) -> None:
        self.rows.append((name, config, seconds, rate))
        print(f"  {name:<28} {config:<26} {seconds * 1e6:10.1f} us   {rate}", flush=True)

    def report(self, columns: tuple[str, str, str, str], failures: list[str]) -> int:
        """Print the rows as a Markdown table under ``columns`` (name, config, us, rate) and the checks' verdict;
        the exit status: 1 if any check failed."""
        print("\n| " + " | ".join(columns) + " |\n" + "| --- " * len(columns) + "|")
        for name, config, seconds, rate in self.rows:
            print(f"| {name} | {config} | {seconds * 1e6:.1f} | {rate} |")
        print(f"\nchecks: {'ALL BIT-EXACT' if not failures else 'MISMATCH: ' + ', '.join(failures)}")
        return 1 if failures else 0


class KernelSettings:
    """The CUDA kernels' module settings by name: NAME of caramel.backends.cuda.ntt, ew.NAME of
    caramel.backends.cuda.elementwise, plan.NAME of caramel.plan.order (read when a plan is built). ``apply(spec)``
    restores what earlier calls changed, then applies ``spec`` ("NAME=INT,NAME=INT", "" or "default" for the modules'
    own; a tuple setting takes INT/INT/...)."""

    def __init__(self):
        from caramel.backends.cuda import elementwise, ntt
        from caramel.plan import order

        self.modules = {"": ntt, "ew.": elementwise, "plan.": order}
        self.saved: dict[tuple[object, str], object] = {}

    def check(self, spec: str) -> None:
        """SystemExit naming the first unknown setting of ``spec``."""
        for item in filter(None, spec.split(",")):
            if item != "default":
                module, attr = self._where(item.partition("=")[0])
                if not hasattr(module, attr):
                    raise SystemExit(f"no kernel setting {item.partition('=')[0]}")

    def apply(self, spec: str) -> None:
        self.check(spec)
        for (module, attr), value in self.saved.items():
            setattr(module, attr, value)
        for item in filter(None, spec.split(",")):
            if item != "default":
                name, _, value = item.partition("=")
                module, attr = self._where(name)
                self.saved.setdefault((module, attr), getattr(module, attr))
                old = getattr(module, attr)
                setattr(module, attr, tuple(int(v) for v in value.split("/")) if isinstance(old, tuple)
                        else type(old)(int(value)))

    def _where(self, name: str):
        prefix = next((p for p in self.modules if p and name.startswith(p)), "")
        return self.modules[prefix], name[len(prefix):]


def sets_for(bytes_per_set: int) -> int:
    return max(2, min(16, SET_BYTES // max(bytes_per_set, 1)))


def benchmark(n: int) -> list:
    import cupy as cp

    from caramel.backends.cuda import CudaRing, FusedOp, FusedProgram
    from caramel.backends.cuda import automorphism as dauto
    from caramel.backends.cuda import basis as dbasis
    from caramel.backends.cuda import crt as dcrt
    from caramel.backends.cuda import elementwise as ew
    from caramel.backends.cuda import ntt as dntt
    from caramel.ring import Context, Mode

    t0 = time.time()
    ctx = Context(n)
    ring = CudaRing(ctx)
    ring.twiddles
    print(f"tables for N = {n}: {time.time() - t0:.1f} s", flush=True)
    bench = Bench(cp, n)
    limb_bytes = 4 * n
    rng = np.random.default_rng()

    def i32(a):
        return cp.asarray(np.ascontiguousarray(np.asarray(a, dtype=np.int32)))

    def arena_of(rows: int):
        return cp.asarray(rng.integers(0, ctx.primes[0], (rows, n), dtype=np.uint64).astype(np.uint32))

    # Ceiling: device-to-device copy of a large buffer.
    big = arena_of(1024)
    big2 = cp.empty_like(big)
    t = bench.time(lambda s: big2.__setitem__(Ellipsis, big), 1, per_replay=8)
    copy_gbs = 2 * big.nbytes / t / 1e9
    bench.add("device copy (ceiling)", "256 MiB", t, f"{copy_gbs:8.0f} GB/s")
    del big, big2

    # NTT / INTT.
    for rows in (64, 512):
        sets = sets_for(2 * rows * limb_bytes)
        arena = arena_of(2 * rows * sets)
        primes = i32(np.arange(rows) % 64)
        ins = [i32(np.arange(rows) + 2 * rows * s) for s in range(sets)]
        outs = [i32(np.arange(rows) + 2 * rows * s + rows) for s in range(sets)]
        for fname, fn in (("ntt", dntt.ntt), ("intt", dntt.intt)):
            t = bench.time(lambda s: fn(ring, arena, ins[s], outs[s], primes), sets)
            bench.add(f"{fname}", f"N={n} R={rows}", t,
                      f"{rows / t / 1e6:8.2f} M limbs/s  {4 * rows * limb_bytes / t / 1e9:6.0f} GB/s")
        t = bench.time(lambda s: dntt.ntt(ring, arena, ins[s], ins[s], primes), sets)
        bench.add("ntt in place", f"N={n} R={rows}", t, f"{rows / t / 1e6:8.2f} M limbs/s")
        del arena

    # Elementwise.
    rows = 512
    sets = sets_for(4 * rows * limb_bytes)
    arena = arena_of(4 * rows * sets)
    primes = i32(np.arange(rows) % 64)
    base = [4 * rows * s for s in range(sets)]
    pair = [i32(np.stack([np.arange(rows) + b, np.arange(rows) + b + rows], axis=1)) for b in base]
    one = [i32(np.arange(rows) + b) for b in base]
    out = [i32(np.arange(rows) + b + 2 * rows) for b in base]
    out2 = [i32(np.stack([np.arange(rows) + b + 2 * rows, np.arange(rows) + b + 3 * rows], axis=1)) for b in base]
    scalars = cp.asarray(rng.integers(0, ctx.primes[0], rows, dtype=np.uint64).astype(np.uint32))
    sidx = i32(np.arange(rows))
    for name in ("add", "mul"):
        fn = getattr(ew, name)
        t = bench.time(lambda s: fn(ring, arena, out[s], pair[s], primes), sets)
        bench.add(name, f"R={rows}", t, f"{3 * rows * limb_bytes / t / 1e9:8.0f} GB/s")
    t = bench.time(lambda s: ew.copy(ring, arena, out[s], one[s], primes), sets)
    bench.add("copy", f"R={rows}", t, f"{2 * rows * limb_bytes / t / 1e9:8.0f} GB/s")
    t = bench.time(lambda s: ew.mul_scalar(ring, arena, out[s], one[s], primes, scalars, sidx), sets)
    bench.add("mul_scalar", f"R={rows}", t, f"{2 * rows * limb_bytes / t / 1e9:8.0f} GB/s")
    # A fused step with 2 vector and 1 scalar operands and 2 outputs: (a*b + s, b - a).
    prog = FusedProgram(2, 1, (FusedOp("mul", (0, 1)), FusedOp("add", (3, 2)), FusedOp("sub", (1, 0))), (4, 5))
    sid2 = i32(np.arange(rows)[:, None])
    t = bench.time(lambda s: ew.fused(ring, prog, arena, out2[s], pair[s], primes, scalars, sid2), sets)
    bench.add("fused 2 in -> 2 out", f"R={rows}", t, f"{4 * rows * limb_bytes / t / 1e9:8.0f} GB/s")

    # Automorphism.
    g = i32([ctx.galois_element(1 + (r % 7)) for r in range(rows)])
    t = bench.time(lambda s: dauto.automorphism(ring, arena, one[s], out[s], g), sets)
    bench.add("automorphism", f"R={rows}", t,
              f"{rows / t / 1e6:8.2f} M limbs/s  {2 * rows * limb_bytes / t / 1e9:6.0f} GB/s")

    # sud lift.
    src63 = i32(np.full(rows, 63))
    t = bench.time(lambda s: dbasis.sud_lift(ring, arena, one[s], out[s], src63, primes, Mode.EXACT), sets)
    bench.add("sud_lift exact", f"R={rows}", t, f"{2 * rows * limb_bytes / t / 1e9:8.0f} GB/s")
    del arena

    # Base conversion (ModUp-like and ModDown-like), batch 2 (both halves of a ciphertext).
    for s_in, d_out in ((16, 32), (32, 32), (4, 40)):
        in_limbs = list(range(s_in))
        out_limbs = list(range(s_in, s_in + d_out - 1)) + [63]
        conv = dbasis.BaseConversion(ring, in_limbs, out_limbs)
        per = 2 * (s_in + d_out)
        sets = sets_for(per * limb_bytes)
        arena = arena_of(per * sets)
        ins = [i32(np.arange(2 * s_in).reshape(2, s_in) + per * s) for s in range(sets)]
        outs = [i32(np.arange(2 * d_out).reshape(2, d_out) + per * s + 2 * s_in) for s in range(sets)]
        for mode in (Mode.TEXTBOOK, Mode.EXACT, Mode.EMULATOR):
            t = bench.time(lambda s: conv.convert(arena, ins[s], outs[s], mode), sets)
            bench.add(f"base conversion {mode.value}", f"S={s_in} D={d_out} B=2", t,
                      f"{2 * d_out / t / 1e6:8.2f} M out limbs/s {per * limb_bytes / t / 1e9:5.0f} GB/s")
        del arena

    # rsv (m = 4 limbs, 2 accumulators, 4 sources each) and mod.
    m = 4
    crt_basis = dcrt.CrtBasis(ring, list(range(m)))
    arena = arena_of(4 * m + 2)  # residues < q_0: canonical for every limb
    arena[: 2 * m] = 0  # the two accumulators (rsi)
    acc = i32(np.arange(2 * m).reshape(2, m))
    srcs = i32(np.arange(2 * m).reshape(2, m) + 2 * m)
    pos = i32(np.tile(np.arange(m), (2, 1)))
    t = bench.time(lambda s: crt_basis.rsv(arena, acc, srcs, pos), 1)
    bench.add("rsv (m=4, K=4, G=2)", "", t, f"{2 * m / t / 1e6:8.2f} M rsv limbs/s")
    outs = i32(np.arange(2) + 4 * m)
    mod_primes = i32([0, 1])
    t = bench.time(lambda s: dcrt.mod(ring, arena, acc, outs, mod_primes), 1)
    bench.add("mod (m=4, R=2)", "", t, f"{2 / t / 1e6:8.2f} M limbs/s")
    return bench.rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"device: {props['name'].decode()} cc {dev.compute_capability}, CuPy {cp.__version__}, "
          f"NumPy {np.__version__}, date {time.strftime('%Y-%m-%d')}", flush=True)
    status = 0 if args.no_tests else run_tests()
    rows = [] if args.no_bench else benchmark(args.n)
    print("\n=== caramel CUDA kernels ===")
    print(f"checks vs caramel.ring: {'skipped' if args.no_tests else ('PASS' if status == 0 else f'FAIL ({status})')}")
    for name, config, seconds, rate in rows:
        print(f"{name:<28} {config:<22} {seconds * 1e6:10.1f} us  {rate}")
    return status


if __name__ == "__main__":
    sys.exit(main())
