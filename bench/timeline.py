"""The timeline model's benchmark (issue 38): each device's kernels timed on one GPU, the model's predictions for
2, 4 and 8 GPUs, and on a machine of several GPUs the measured replays beside them, a re-fit of the collective
model and the transport comparison. Every step writes JSON under ``--out``.

    python -m bench.timeline --out DIR [--archive PATH] [--chips 1,2,4,8] [--n 65536] [--backend gpu|cpu-plan]
                             [--repeats 10] [--streams 3] [--steps profile,predict,measure,refit,transport]
    python -m bench.timeline --validate --out DIR    # the model against the recorded replays (any machine)

Steps:

* ``profile`` (one GPU is enough): for each K of ``--chips``, every device program of BootstrapLike_51L_Kc on K
  devices, alone, without its collectives: every call timed (GPU: clock stamps in a one-stream graph, as
  ``caramel profile``; cpu-plan: the wall clock) and its floor (its graph replayed on the run's streams; the 1-chip
  program as a 1-chip run schedules it: every stream for kernels) -> ``timeline_<K>c.json``, the model's input.
* ``predict``: the model's replay of each K on K GPUs from those files (collectives: ``--collectives FILE`` or
  :data:`caramel.timeline.FIRST_FIT`; compute sharing fitted to the floors) -> ``predictions.json``. PREDICTIONS.
* ``measure`` (GPU: K <= the GPUs present; cpu-plan: simulated devices, wall clock): the K-chip program on K
  devices, replays timed, digest against ``bench/reference_digests.json`` -> ``measured.json``, with the
  prediction beside each.
* ``refit`` (2 GPUs or more): NCCL group calls in CUDA graphs timed by group size, calls and payload ->
  ``collective_fit.json`` (the samples, the fitted model) and the predictions again with it.
* ``transport`` (2 GPUs or more): limbs from GPU 0 to GPU 1, and both ways at once, by NCCL broadcast in a
  graph and by peer copies on the copy engines (``cudaMemcpyPeerAsync`` eager and captured: graph memcpy
  nodes); NCCL's protocol and channel settings each in a child process -> ``transport.json``.

``--validate`` simulates the recorded multi-GPU replays of docs/PERFORMANCE.md (:data:`RECORDED`) from the kernel
cost estimates, calibrated to what each record measured (its devices' floors, or its 1-chip replays), and writes
``validation.json``: the issue's check of the model (within 10%), with the model's PREDICTIONS for 2, 4 and 8 GPUs
before and after this code's communication (:func:`compare`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bench import harness
from caramel.backends.cuda.target import CUDA_TARGET

ROOT = Path(__file__).resolve().parents[1]
LIMB = 4  # bytes per residue


def log(text: str) -> None:
    print(time.strftime("%H:%M:%S"), text, file=sys.stderr, flush=True)


def write(out: Path, name: str, data) -> Path:
    from caramel.results import write_json

    return write_json(out / name, data)


def member(archive: str, k: int) -> str:
    from caramel.scaling import family_member

    return family_member(str(archive), k)


def inputs(program, ctx, seed: int):
    """The inputs of ``caramel run --seed SEED`` (their digests are stored as '... run --seed 1')."""
    from caramel.api import prepare_inputs
    from caramel.ckks.keyset import generate_keyset

    return prepare_inputs(program, ctx, generate_keyset(program, ctx, seed), seed).memory


# ---------------------------------------------------------------------------------------------- profile


def profile_devices(plan, ctx, memory, k: int, backend: str, repeats: int, streams: int):
    """[(floor ms, DeviceTimeline)] of each device program of ``plan`` on ``k`` devices, alone, no collectives."""
    from caramel.execute.runner import DeviceRun
    from caramel.timeline import measured_timeline

    comm_stream = k > 1
    if backend == "gpu":
        from caramel.execute.cuda_graph import GRAPH_STREAMS
        from caramel.scaling import device_profiles

        s = streams if k > 1 else GRAPH_STREAMS
        return device_profiles(plan, ctx, memory, "exact", k, repeats, s, comm_stream=comm_stream)
    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.execute.placement import device_programs

    out = []
    for prog in device_programs(plan, k, ctx.primes, reuse="none", keep_inputs=True):
        run = DeviceRun(prog, plan, ctx, memory, "exact", NumpyBackend)
        marks: list[float] = []
        t0 = time.perf_counter()
        run.run(lambda i: marks.append(time.perf_counter()), collectives=False)
        starts = [t0] + marks[:-1]
        call_us = [1e6 * (b - a) for a, b in zip(starts, marks)]
        out.append((sum(call_us) / 1e3, measured_timeline(run, run.schedule(streams, comm_stream=comm_stream),
                                                          call_us, ctx.n)))
    return out


def step_profile(args, out: Path) -> list[Path]:
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.timeline import timeline_json

    ctx = Context(n=args.n)
    files = []
    for k in args.chips:
        program = load_program(member(args.archive, k), progress=False)
        plan = build_plan(program)
        memory = inputs(program, ctx, args.seed)
        log(f"profile: {program.name}, {k} device program(s) alone, {args.backend}")
        profiles = profile_devices(plan, ctx, memory, k, args.backend, args.repeats, args.streams)
        data = {"program": program.name, "chips": k, "n": args.n, "backend": args.backend,
                "streams": args.streams if k > 1 else None, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "devices": [{"floor_ms": floor, **timeline_json(tl)} for floor, tl in profiles]}
        files.append(write(out, f"timeline_{k}c.json", data))
        log(f"profile: {program.name}: floors " + " / ".join(f"{f:.2f}" for f, _ in profiles) + " ms")
    return files


# ---------------------------------------------------------------------------------------------- predict


def predict_file(path: Path, model=None) -> dict:
    """The model's replay of one ``timeline_<K>c.json`` (compute sharing fitted to its floors)."""
    from caramel.timeline import FIRST_FIT, OVERLAP, fit_overlap, simulate, timeline_from_json

    data = json.loads(path.read_text())
    model = model or FIRST_FIT
    tls = [timeline_from_json(d) for d in data["devices"]]
    fits = [f for f in (fit_overlap(tl, 1e3 * d["floor_ms"]) for tl, d in zip(tls, data["devices"])) if f is not None]
    overlap = float(np.median(fits)) if fits else OVERLAP
    r = simulate(tls, model, overlap=overlap)
    inputs_note = ("kernel times of a GPU" if data["backend"] == "gpu" else
                   "kernel times of the CPU with a GPU's collectives: checks the machinery, predicts no machine")
    return {"program": data["program"], "gpus": data["chips"], "kind": "prediction", "inputs": inputs_note,
            "predicted_ms": r.predicted_ms,
            "compute_floor_ms": r.compute_floor_ms, "comm_wait_ms": r.comm_wait_ms, "collectives": r.collectives,
            "payload_bytes": sum(d.nbytes for d in r.devices), "overlap": overlap, "collective_model": r.model,
            "measured_floors_ms": [d["floor_ms"] for d in data["devices"]],
            "predicted_floors_ms": [d.floor_us / 1e3 for d in r.devices]}


def step_predict(args, out: Path, model=None, name: str = "predictions.json") -> list[dict]:
    rows = [predict_file(out / f"timeline_{k}c.json", model) for k in args.chips]
    write(out, name, {"kind": "predictions", "note": "predictions of the timeline model, not measurements",
                      "points": rows})
    for r in rows:
        log(f"predict: {r['program']} on {r['gpus']} GPU(s): {r['predicted_ms']:.2f} ms PREDICTED "
            f"(floor {r['compute_floor_ms']:.2f}, communication and waiting {r['comm_wait_ms']:.2f})")
    return rows


# ---------------------------------------------------------------------------------------------- measure


def stored_digest(program: str, n: int, seed: int) -> str | None:
    return harness.stored_digests().get(harness.digest_key(program, n, seed))


def step_measure(args, out: Path, present: int) -> list[dict]:
    from caramel.api import output_digest
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context

    ctx = Context(n=args.n)
    predicted = {p["gpus"]: p for p in json.loads((out / "predictions.json").read_text())["points"]} \
        if (out / "predictions.json").exists() else {}
    rows = []
    for k in args.chips:
        if k > present:
            log(f"measure: {k} GPUs asked for, {present} present: not run")
            continue
        program = load_program(member(args.archive, k), progress=False)
        plan = build_plan(program)
        memory = inputs(program, ctx, args.seed)
        if args.backend == "gpu":
            from caramel.execute.cuda_graph import GRAPH_STREAMS, GpuRun, MultiGpuRun

            run = (GpuRun(plan, ctx, memory, streams=GRAPH_STREAMS) if k == 1
                   else MultiGpuRun(plan, ctx, memory, "exact", k, streams=args.streams))
        else:
            from caramel.execute.drive import HostRun

            run = HostRun(plan, ctx, memory, "exact", k, streams=args.streams, seed=args.seed)
        try:
            t = run.time(args.repeats)
            digest = output_digest(program, run.result().memory)
        finally:
            run.close()
        want = stored_digest(program.name, args.n, args.seed)
        row = {"program": program.name, "gpus": k, "kind": "measurement", "backend": args.backend,
               "replay_ms": t.median_ms, "min_ms": t.min_ms, "max_ms": t.max_ms, "repeats": t.repeats,
               "digest": digest, "digest_matches_reference": None if want is None else digest == want,
               "predicted_ms": predicted.get(k, {}).get("predicted_ms")}
        rows.append(row)
        log(f"measure: {program.name} on {k} device(s): {t}; digest matches: {row['digest_matches_reference']}; "
            f"predicted {row['predicted_ms']}")
    write(out, "measured.json", {"kind": "measured", "points": rows})
    return rows


# ---------------------------------------------------------------------------------------------- NCCL


@dataclass(frozen=True)
class Shape:
    """``groups`` group calls of ``calls`` broadcasts of ``limbs`` limbs each, roots rotating."""

    groups: int
    calls: int
    limbs: int


#: The NCCL shapes that the re-fit times on every group size (enough to fix all three terms).
SHAPES = (Shape(1, 1, 1), Shape(1, 1, 64), Shape(1, 16, 1), Shape(1, 16, 16), Shape(8, 1, 1), Shape(8, 4, 16),
          Shape(1, 51, 1), Shape(1, 4, 308))


def _per_gpu(gpus: int, body) -> list:
    """``body(d)`` on one thread per GPU d (its device current), the threads lined up at a barrier first."""
    import cupy as cp

    barrier, out, errors = threading.Barrier(gpus), [None] * gpus, []

    def go(d):
        try:
            with cp.cuda.Device(d):
                barrier.wait(120)
                out[d] = body(d)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=go, args=(d,), daemon=True) for d in range(gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"NCCL benchmark on {gpus} GPUs failed: {errors[:1] or 'timed out'}")
    return out


def time_nccl(gpus: int, shapes: Sequence[Shape], n: int, repeats: int) -> list[dict]:
    """Each shape as one CUDA graph per GPU (broadcasts of uint32 rows, roots rotating over the GPUs), replayed
    ``repeats`` times on all GPUs at once: the slowest GPU's median per replay, in microseconds."""
    import cupy as cp
    from cupy.cuda import nccl

    from caramel.execute.fabric.nccl import nccl_environment

    nccl_environment()
    comms = nccl.NcclCommunicator.initAll(list(range(gpus)))
    biggest = max(s.calls * s.limbs for s in shapes)
    bufs = [None] * gpus
    rows = []
    try:
        def alloc(d):
            bufs[d] = cp.zeros(biggest * n, dtype=cp.uint32)
            cp.cuda.Device(d).synchronize()
        _per_gpu(gpus, alloc)
        for shape in shapes:
            def body(d, shape=shape):
                s = cp.cuda.Stream(non_blocking=True)
                ptr, comm = bufs[d].data.ptr, comms[d]

                def issue():
                    for g in range(shape.groups):
                        nccl.groupStart()
                        for c in range(shape.calls):
                            at = ptr + c * shape.limbs * n * LIMB
                            comm.broadcast(at, at, shape.limbs * n, nccl.NCCL_UINT32, (g + c) % gpus, s.ptr)
                        nccl.groupEnd()
                with s:
                    issue()  # eager warm-up
                s.synchronize()
                s.begin_capture(getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1))
                try:
                    with s:
                        issue()
                finally:
                    graph = s.end_capture()
                times = []
                for _ in range(repeats + 1):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(s)
                    graph.launch(s)
                    e1.record(s)
                    e1.synchronize()
                    times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                del graph
                return times[1:]
            per = _per_gpu(gpus, body)
            us = float(np.median(np.max(np.array(per), axis=0)))
            rows.append({"gpus": gpus, "groups": shape.groups, "calls": shape.groups * shape.calls,
                         "bytes": shape.groups * shape.calls * shape.limbs * n * LIMB, "us": us})
            log(f"nccl: {gpus} GPUs, {shape}: {us:.1f} us")
    finally:
        bufs = [None] * gpus
        for c in comms:
            c.destroy()
    return rows


def step_refit(args, out: Path, present: int):
    from caramel.timeline import CollectiveSample, fit, model_json

    sizes = [g for g in (2, 4, 8) if g <= present]
    if not sizes:
        log("refit: needs 2 GPUs or more")
        return None
    rows = [r for g in sizes for r in time_nccl(g, SHAPES, args.n, args.repeats)]
    samples = [CollectiveSample(r["gpus"], r["groups"], r["calls"], r["bytes"], r["us"], "bench/timeline.py nccl")
               for r in rows]
    model = fit(samples, f"refit {time.strftime('%Y-%m-%d')} on {present} GPU(s) (bench/timeline.py)")
    write(out, "collective_fit.json", {"kind": "collective_fit", "samples": rows, "model": model_json(model)})
    if all((out / f"timeline_{k}c.json").exists() for k in args.chips):
        step_predict(args, out, model, "predictions_refit.json")
    return model


# ---------------------------------------------------------------------------------------------- transport


#: Payloads of the transport comparison, in limbs of N residues.
TRANSPORT_LIMBS = (1, 16, 64, 308)
#: NCCL settings timed in child processes (environment variables; read when communicators are created).
NCCL_SETTINGS = ({}, {"NCCL_PROTO": "Simple"}, {"NCCL_PROTO": "LL128"}, {"NCCL_PROTO": "LL"},
                 {"NCCL_MIN_NCHANNELS": "16"}, {"NCCL_MIN_NCHANNELS": "32"}, {"NCCL_MAX_NCHANNELS": "4"})


def time_peer(n: int, repeats: int) -> list[dict]:
    """GPU 0 -> GPU 1, and both ways at once, by ``cudaMemcpyPeerAsync`` on the copy engines: eager and captured
    in a graph (memcpy nodes), per payload of :data:`TRANSPORT_LIMBS`; microseconds, median."""
    import cupy as cp

    rt = cp.cuda.runtime
    for a, b in ((0, 1), (1, 0)):
        with cp.cuda.Device(a):
            rt._deviceEnsurePeerAccess(b)  # enabled, or already
    size = max(TRANSPORT_LIMBS) * n
    buf = []
    for d in (0, 1):
        with cp.cuda.Device(d):
            buf.append((cp.zeros(size, dtype=cp.uint32), cp.zeros(size, dtype=cp.uint32)))
    rows = []
    for limbs in TRANSPORT_LIMBS:
        nbytes = limbs * n * LIMB
        for both in (False, True):
            for graph in (False, True):
                streams = []
                for d in (0, 1):
                    with cp.cuda.Device(d):
                        streams.append(cp.cuda.Stream(non_blocking=True))

                def issue(d, captured=False):  # device d pulls from the other one into its receive buffer
                    o = 1 - d
                    dst, src = buf[d][1].data.ptr, buf[o][0].data.ptr
                    if captured:  # a capture refuses cudaMemcpyPeerAsync; a unified-address copy becomes a memcpy node
                        rt.memcpyAsync(dst, src, nbytes, rt.memcpyDefault, streams[d].ptr)
                    else:
                        rt.memcpyPeerAsync(dst, d, src, o, nbytes, streams[d].ptr)

                movers = (0, 1) if both else (1,)
                graphs = {}
                if graph:
                    for d in movers:
                        with cp.cuda.Device(d):
                            streams[d].begin_capture(getattr(rt, "streamCaptureModeThreadLocal", 1))
                            try:
                                issue(d, captured=True)
                            finally:
                                graphs[d] = streams[d].end_capture()
                times = []
                for _ in range(repeats + 1):
                    ev = {}
                    for d in movers:
                        with cp.cuda.Device(d):
                            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                            e0.record(streams[d])
                            if graph:
                                graphs[d].launch(streams[d])
                            else:
                                issue(d)
                            e1.record(streams[d])
                            ev[d] = (e0, e1)
                    for d, (e0, e1) in ev.items():
                        with cp.cuda.Device(d):
                            e1.synchronize()
                    times.append(max(cp.cuda.get_elapsed_time(e0, e1) for e0, e1 in ev.values()) * 1e3)
                us = float(np.median(times[1:]))
                rows.append({"transport": "peer copy" + (" in a graph" if graph else ""), "limbs": limbs,
                             "both_ways": both, "us": us, "gbps": (2 if both else 1) * nbytes / (us * 1e3)})
                log(f"transport: {rows[-1]}")
    return rows


def time_nccl_pair(n: int, repeats: int) -> list[dict]:
    """The same payloads by NCCL broadcast in a graph between GPUs 0 and 1: one way (root 0), and both ways at once
    (two broadcasts in one group, roots 0 and 1)."""
    rows = []
    for limbs in TRANSPORT_LIMBS:
        for both in (False, True):
            (r,) = time_nccl(2, [Shape(1, 2 if both else 1, limbs)], n, repeats)
            rows.append({"transport": "nccl broadcast in a graph", "limbs": limbs, "both_ways": both, "us": r["us"],
                         "gbps": r["bytes"] / (r["us"] * 1e3)})
    return rows


def step_transport(args, out: Path, present: int) -> None:
    if present < 2:
        log("transport: needs 2 GPUs or more")
        return
    rows = time_nccl_pair(args.n, args.repeats) + time_peer(args.n, args.repeats)
    settings = []
    for env in NCCL_SETTINGS:
        child = out / "nccl_settings" / ("default" if not env else "_".join(f"{k}={v}" for k, v in env.items()))
        cmd = [sys.executable, "-m", "bench.timeline", "--nccl-only", "--out", str(child), "--n", str(args.n),
               "--repeats", str(args.repeats)]
        log(f"transport: NCCL with {env or 'defaults'} in a child process")
        done = subprocess.run(cmd, env={**os.environ, **env}, cwd=ROOT, timeout=900)
        result = child / "nccl.json"
        settings.append({"env": env, "rc": done.returncode,
                         "rows": json.loads(result.read_text())["rows"] if result.exists() else []})
    write(out, "transport.json", {"kind": "transport", "rows": rows, "nccl_settings": settings})


def nccl_only(args, out: Path) -> None:
    """The child of :func:`step_transport`: the NCCL pair payloads and the re-fit shapes on 2 GPUs."""
    rows = time_nccl_pair(args.n, args.repeats) + time_nccl(2, SHAPES, args.n, args.repeats)
    write(out, "nccl.json", {"kind": "nccl", "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                             "rows": rows})


# ---------------------------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Record:
    """A recorded multi-GPU replay of BootstrapLike_51L_Kc on K GPUs (docs/PERFORMANCE.md): ``streams`` a GPU,
    the median replay, and what the same record measured to calibrate the compute: its devices' floors (all, or
    the busiest alone), or its 1-chip program's one-stream replay and, with several streams, its replay on
    ``one_multi`` = (streams, ms)."""

    source: str
    gpus: int
    streams: int
    replay_ms: float
    floors_ms: tuple[float, ...] = ()
    one_stream_1c_ms: float | None = None
    one_multi: tuple[int, float] | None = None


RECORDED = (
    Record("session 3 (3ca5e2c), scaling of record", 2, 2, 19.89, floors_ms=(17.00,)),
    Record("session 3 (3ca5e2c), scaling of record", 4, 2, 16.11, floors_ms=(11.98,)),
    Record("session 6 (e2d0a43)", 2, 2, 19.31, floors_ms=(16.22, 16.22)),
    Record("session 10 (3c0abce)", 2, 1, 14.96, floors_ms=(11.80, 11.84), one_stream_1c_ms=17.77),
    Record("session 10 (3c0abce)", 4, 1, 13.11, floors_ms=(8.84, 8.76, 8.73, 8.58), one_stream_1c_ms=17.77),
    Record("session 18 (8450cf6), three streams", 2, 3, 13.28, one_stream_1c_ms=16.03, one_multi=(4, 13.80)),
    Record("session 18 (8450cf6), three streams", 4, 3, 12.02, one_stream_1c_ms=16.03, one_multi=(4, 13.80)),
)


def recorded_programs(plan, gpus: int, primes):
    """The device programs as the recorded runs had them: a level's communication in one step, the calls through
    staging rows (gathered and scattered), rows a buffer."""
    from caramel.execute.placement import device_programs

    return device_programs(plan, gpus, primes, reuse="none", keep_inputs=True, part_limbs=1 << 30, lay_out=False)


def validate(archive: str, records: Sequence[Record] = RECORDED, placement=None) -> list[dict]:
    """Each record simulated with today's plan (kernel cost estimates, device programs of ``placement``, default
    :func:`recorded_programs`) and :data:`caramel.timeline.FIRST_FIT`, the compute calibrated to what the record
    measured: its devices' floors (each device's estimates scaled to its floor; the busiest alone: one scale for
    all), else its 1-chip one-stream replay (one scale) and the compute sharing fitted to its 1-chip multi-stream
    replay."""
    from caramel.execute.placement import device_programs
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.timeline import FIRST_FIT, OVERLAP, alone_us, device_timelines, fit_overlap, simulate

    ctx = Context(n=65536)
    placement = placement or (lambda plan, g: recorded_programs(plan, g, ctx.primes))
    plans, one = {}, {}
    rows = []
    for rec in records:
        if rec.gpus not in plans:
            plans[rec.gpus] = build_plan(load_program(member(archive, rec.gpus), progress=False))
        tls = device_timelines(placement(plans[rec.gpus], rec.gpus), ctx.n, rec.streams, target=CUDA_TARGET)
        overlap, how = OVERLAP, ""
        if rec.floors_ms:
            alone = [alone_us(tl) for tl in tls]
            if len(rec.floors_ms) == len(tls):
                scale = [1e3 * f / a for f, a in zip(rec.floors_ms, alone)]
            else:
                scale = [1e3 * rec.floors_ms[0] / max(alone)] * len(tls)
            how = "devices' floors of the record"
        else:
            if 1 not in plans:
                plans[1] = build_plan(load_program(member(archive, 1), progress=False))
            for s in (1, rec.one_multi[0]) if rec.one_multi else (1,):
                if s not in one:
                    progs1 = device_programs(plans[1], 1, ctx.primes, reuse="none", keep_inputs=True)
                    one[s] = device_timelines(progs1, ctx.n, s, comm_stream=False, target=CUDA_TARGET)[0]
            scale = [1e3 * rec.one_stream_1c_ms / one[1].compute_us()] * len(tls)
            if rec.one_multi:
                fitted = fit_overlap(one[rec.one_multi[0]].scaled(scale[0]), 1e3 * rec.one_multi[1])
                overlap = OVERLAP if fitted is None else fitted
            how = "1-chip replays of the record"
        r = simulate([tl.scaled(f) for tl, f in zip(tls, scale)], FIRST_FIT, overlap=overlap)
        rows.append({"source": rec.source, "gpus": rec.gpus, "streams": rec.streams, "measured_ms": rec.replay_ms,
                     "predicted_ms": r.predicted_ms, "error": r.predicted_ms / rec.replay_ms - 1,
                     "compute_floor_ms": r.compute_floor_ms, "comm_wait_ms": r.comm_wait_ms, "overlap": overlap,
                     "calibrated_to": how})
        log(f"validate: {rec.source}, {rec.gpus} GPUs, {rec.streams} stream(s): measured {rec.replay_ms:.2f} ms, "
            f"predicted {r.predicted_ms:.2f} ({rows[-1]['error']:+.1%}), calibrated to the {how}")
    return rows


#: BootstrapLike_51L_1c on one H200 at 9d91a43 (issue 38): one stream 15.3 ms, four streams 13.20 ms.
TODAY_1C = (15.3, (4, 13.20))


def compare(archive: str, chips: Sequence[int] = (2, 4, 8), streams: Sequence[int] = (3, 5),
            one_c: tuple[float, tuple[int, float]] = TODAY_1C) -> list[dict]:
    """PREDICTIONS of BootstrapLike_51L_Kc on K GPUs before and after this code's communication (the recorded
    layout, :func:`recorded_programs`, against :func:`caramel.execute.placement.device_programs`), from the kernel
    cost estimates scaled to the 1-chip program's one-stream replay ``one_c[0]`` and the compute sharing fitted to
    its multi-stream replay ``one_c[1]``, by ``streams`` a GPU (the last for communication)."""
    from caramel.execute.placement import device_programs
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.timeline import FIRST_FIT, OVERLAP, device_timelines, fit_overlap, simulate

    ctx = Context(n=65536)
    plan1 = build_plan(load_program(member(archive, 1), progress=False))
    prog1 = device_programs(plan1, 1, ctx.primes, reuse="none", keep_inputs=True)
    one = device_timelines(prog1, ctx.n, 1, comm_stream=False, target=CUDA_TARGET)[0]
    scale = 1e3 * one_c[0] / one.compute_us()
    s1, ms1 = one_c[1]
    fitted = fit_overlap(device_timelines(prog1, ctx.n, s1, comm_stream=False, target=CUDA_TARGET)[0].scaled(scale),
                         1e3 * ms1)
    overlap = OVERLAP if fitted is None else fitted
    rows = []
    for k in chips:
        plan = build_plan(load_program(member(archive, k), progress=False))
        for label, progs in (("before", recorded_programs(plan, k, ctx.primes)),
                             ("after", device_programs(plan, k, ctx.primes, reuse="none", keep_inputs=True))):
            for s in streams:
                tls = device_timelines(progs, ctx.n, s, target=CUDA_TARGET)
                r = simulate([tl.scaled(scale) for tl in tls], FIRST_FIT,
                             overlap=overlap)
                rows.append({"program": f"BootstrapLike_51L_{k}c", "gpus": k, "code": label, "streams": s,
                             "kind": "prediction", "predicted_ms": r.predicted_ms,
                             "compute_floor_ms": r.compute_floor_ms, "comm_wait_ms": r.comm_wait_ms,
                             "collectives": r.collectives, "groups": max(d.groups for d in r.devices),
                             "payload_bytes": sum(d.nbytes for d in r.devices), "overlap": overlap})
                log(f"compare: {k} GPUs, {label}, {s} streams: PREDICTED {r.predicted_ms:.2f} ms (floor "
                    f"{r.compute_floor_ms:.2f}, communication and waiting {r.comm_wait_ms:.2f}, "
                    f"{rows[-1]['collectives']} calls in {rows[-1]['groups']} groups)")
    return rows


# ---------------------------------------------------------------------------------------------- main


def gpus_present(backend: str, chips: Sequence[int]) -> int:
    if backend != "gpu":
        return max(chips)  # simulated devices
    import cupy as cp

    return cp.cuda.runtime.getDeviceCount()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the JSON files (created)")
    ap.add_argument("--archive", help="BootstrapLike_51L archive or family prefix (default: the archive, looked up "
                    "as programs are: .data/, $CARAMEL_SHARED_PROGRAMS, ../shared/programs)")
    ap.add_argument("--chips", default="1,2,4,8", help="the K of BootstrapLike_51L_Kc (default 1,2,4,8)")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=1, help="inputs of `caramel run --seed` (default 1)")
    ap.add_argument("--backend", choices=("gpu", "cpu-plan"), default="gpu")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--streams", type=int, default=3, help="streams a device of a multi-GPU run (default 3)")
    ap.add_argument("--steps", default="profile,predict,measure,refit,transport")
    ap.add_argument("--collectives", type=Path, help="a collective_fit.json whose model the predict step uses")
    ap.add_argument("--validate", action="store_true", help="only the model against the recorded replays")
    ap.add_argument("--nccl-only", action="store_true", help=argparse.SUPPRESS)  # transport's child process
    args = ap.parse_args(argv)
    args.archive = args.archive or harness.family_archive()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    args.out.mkdir(parents=True, exist_ok=True)
    args.chips = [int(k) for k in args.chips.split(",")]
    if args.nccl_only:
        nccl_only(args, args.out)
        return 0
    if args.validate:
        rows = validate(args.archive)
        write(args.out, "validation.json", {"kind": "validation", "rows": rows,
                                            "within_10_percent": all(abs(r["error"]) <= 0.10 for r in rows),
                                            "predictions_before_after": compare(args.archive)})
        return 0
    steps = set(args.steps.split(","))
    unknown = steps - {"profile", "predict", "measure", "refit", "transport"}
    if unknown:
        ap.error(f"unknown steps {sorted(unknown)}")
    present = gpus_present(args.backend, args.chips)
    model = None
    if args.collectives:
        from caramel.timeline import model_from_json

        model = model_from_json(json.loads(args.collectives.read_text())["model"])
    if "profile" in steps:
        step_profile(args, args.out)
    if "predict" in steps:
        step_predict(args, args.out, model)
    if "measure" in steps:
        step_measure(args, args.out, present)
    if args.backend == "gpu" and "refit" in steps:
        step_refit(args, args.out, present)
    if args.backend == "gpu" and "transport" in steps:
        step_transport(args, args.out, present)
    return 0


if __name__ == "__main__":
    sys.exit(main())
