#!/usr/bin/env python3
"""The roofline of BootstrapLike_51L_1c (graph + fusion, one stream) at N = 65536 on one GPU: the replay
time, then one instrumented run, kernel by kernel (run from the repository root with .data/)."""
import time, numpy as np
from caramel.parse import load_program
from caramel.ring import Context
from caramel.api import default_spec
from caramel.ckks.check import prepare_check
from caramel.ckks.device import using
from caramel.plan import build_plan
from caramel.execute.cuda_graph import GpuRun
from caramel.profile import _instrument_gpu, copy_bandwidth, render_roofline
p = load_program(".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c"); ctx = Context(n=65536)
with using("gpu"):
    mem = prepare_check(default_spec(p), p, ctx, rng=np.random.default_rng(1)).memory
run = GpuRun(build_plan(p), ctx, mem, "exact"); run.run(graph=False); run.capture()
print(run.time(graph=True, repeats=10, warmup=1))
rec = _instrument_gpu(run); print(render_roofline(rec, copy_bandwidth()))
