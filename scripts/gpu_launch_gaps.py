"""What a dependent launch costs inside a CUDA graph, and what programmatic dependent launch (PDL) saves: chains of
M kernels on one stream, captured and replayed; per kernel, the replay time over M. Kernels: empty, or a wave of
blocks that each spin for --spin-us. PDL: every launch through cuLaunchKernelEx with programmatic stream
serialization; the kernel waits (griddepcontrol.wait) before its work, and triggers its dependents at its start
(griddepcontrol.launch_dependents) when --trigger.

    PYTHONPATH=. python3 scripts/gpu_launch_gaps.py [--kernels 481] [--spin-us 20]
"""

from __future__ import annotations

import argparse
import ctypes

SRC = r"""
extern "C" __global__ void work(unsigned long long* sink, long long cycles, int pdl, int trigger) {
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (trigger) asm volatile("griddepcontrol.launch_dependents;");
    const long long t0 = clock64();
    unsigned long long x = threadIdx.x;
    while (clock64() - t0 < cycles) x = x * 6364136223846793005ull + 1;
    if (x == 42) sink[0] = x;
}
"""


class LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("nattrs", ctypes.c_uint)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=481)
    ap.add_argument("--spin-us", default="0,5,20")
    ap.add_argument("--blocks", default="132,528,700")
    args = ap.parse_args()
    import cupy as cp

    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.c_void_p]
    from caramel.backends.cuda.context import NVRTC_OPTIONS

    fn = cp.RawModule(code=SRC, options=NVRTC_OPTIONS).get_function("work")
    sink = cp.zeros(1, dtype=cp.uint64)
    clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
    stream = cp.cuda.Stream(non_blocking=True)
    attr = LaunchAttr()
    attr.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    ctypes.memmove(attr.value, ctypes.byref(ctypes.c_int(1)), 4)

    def launch(blocks, cycles, pdl, trigger):
        if not pdl:
            fn((blocks,), (256,), (sink, cp.int64(cycles), cp.int32(0), cp.int32(0)), stream=stream)
            return
        vals = [ctypes.c_uint64(sink.data.ptr), ctypes.c_int64(cycles), ctypes.c_int32(1), ctypes.c_int32(trigger)]
        params = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        cfg = LaunchConfig(blocks, 1, 1, 256, 1, 1, 0, stream.ptr, ctypes.pointer(attr), 1)
        rc = cuda.cuLaunchKernelEx(ctypes.byref(cfg), fn.kernel.ptr, params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernelEx: {rc}")

    for spin in map(float, args.spin_us.split(",")):
        cycles = int(spin * clock_khz / 1e3)
        for blocks in map(int, args.blocks.split(",")):
            for label, pdl, trigger in (("plain", 0, 0), ("pdl", 1, 0), ("pdl+trigger", 1, 1)):
                launch(blocks, cycles, pdl, trigger)
                stream.synchronize()
                stream.begin_capture()
                for _ in range(args.kernels):
                    launch(blocks, cycles, pdl, trigger)
                graph = stream.end_capture()
                graph.launch(stream)
                stream.synchronize()
                times = []
                for _ in range(5):
                    a, b = cp.cuda.Event(), cp.cuda.Event()
                    a.record(stream)
                    graph.launch(stream)
                    b.record(stream)
                    b.synchronize()
                    times.append(cp.cuda.get_elapsed_time(a, b))
                per = sorted(times)[2] * 1e3 / args.kernels
                print(f"spin {spin:5.1f} us, {blocks:4d} blocks, {label:12s}: {per:7.2f} us a kernel "
                      f"({per - spin * (1 + (blocks - 1) // (132 * 8)):+.2f} over the spin's waves)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
