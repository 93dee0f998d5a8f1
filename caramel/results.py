"""Results a program can read: the JSON of ``caramel run --json`` and ``caramel profile --json``.

A run's record (:func:`run_record`)::

    {"caramel": 1, "kind": "run", "program": ..., "n": ..., "mode": ..., "backend": ...,
     "fused": true | false | null (the plan's fusion; null: the reference interpreter), "devices": ...,
     "seed": ..., "key_seed": ..., "digest": "<sha256>", "passed": true | false | null,
     "checks": {"z": {"verdict": "PASS" | "FAIL" | "none", "precision_bits": ..., "median_bits": ...,
                      "max_error": ..., "median_error": ..., "tolerance_bits": ..., "limbs": [...]}},
     "timings_s": {"load": ..., "plan": ..., "keys": ..., "encrypt": ..., "run": ..., "decrypt": ...,
                   "check": ...},
     "environment": {"caramel": ..., "python": ..., "numpy": ..., "cupy": ..., "cuda": ..., "nccl": ...,
                     "gpus": [...]}}

A batch adds ``"instances": [<one record per instance, without environment>]`` and ``"summary"``
(:mod:`caramel.batch`). Infinite precisions (an exact output) are written as the strings ``"inf"``
/ ``"-inf"``, so the file is strict JSON. Files are written atomically (:func:`write_json`).

Phases: ``load`` (parse or cache, validate), ``keys`` (secrets and evaluation keys; 0 when given),
``encrypt`` (encode and encrypt the inputs, bind the memory image), ``plan`` (build the executor:
the plan, and on the GPU nothing resident yet), ``run`` (the executor's call: on the GPU also the
upload, the warm-up and the graph capture), ``decrypt`` (the outputs of ``--save-outputs``),
``check`` (decrypt the outputs and compare them with the check's formulas, and the digest).

The human output prints the same time breakdown in one line (:func:`timings_line`).
"""

from __future__ import annotations

import json
import math
import platform
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from caramel.outfiles import write_atomic

#: The phases of a run, in the order they happen (and are printed).
PHASES = ("load", "plan", "keys", "encrypt", "run", "decrypt", "check")
_PHASE_ORDER = {p: i for i, p in enumerate(PHASES)}
#: Version of the record layout.
SCHEMA = 1


@dataclass
class Timings:
    """Seconds per phase (:data:`PHASES`; a phase that did not happen is absent)."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` body into phase ``name`` (added to what it already holds)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in _in_phase_order(self.seconds)}


def _in_phase_order(timings: Mapping[str, float]) -> list[tuple[str, float]]:
    """The items of ``timings`` in the order of :data:`PHASES` (other names last)."""
    return sorted(timings.items(), key=lambda kv: _PHASE_ORDER.get(kv[0], len(PHASES)))


def timings_line(timings: Mapping[str, float]) -> str:
    """``load 0.01 s, plan 0.02 s, keys 1.20 s, ...`` in phase order."""
    parts = [f"{k} {v:.2f} s" for k, v in _in_phase_order(timings)]
    return "time: " + ", ".join(parts) if parts else "time: -"


def _bits(x: float) -> float | str:
    """A float for JSON: finite as is, infinities as "inf"/"-inf", NaN as "nan"."""
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def check_record(report) -> dict[str, dict[str, Any]]:
    """Per output of a :class:`~caramel.ckks.check.CheckReport`: verdict, bits, errors, bar."""
    if report is None:
        return {}
    out = {}
    for name, r in report.results.items():
        out[name] = {
            "verdict": {True: "PASS", False: "FAIL", None: "none"}[r.passed],
            "precision_bits": _bits(r.precision_bits),
            "median_bits": _bits(r.median_bits),
            "max_error": _bits(r.max_error),
            "median_error": _bits(r.median_error),
            "tolerance_bits": r.tolerance_bits,
            "limbs": list(r.limbs),
        }
    return out


def environment(probe_gpu: bool = True) -> dict[str, Any]:
    """Versions of caramel, Python, NumPy and (when importable) CuPy, CUDA and NCCL, and the GPUs'
    names. Never raises: what cannot be found is null."""
    import numpy as np

    from caramel.version import __version__

    env: dict[str, Any] = {"caramel": __version__, "python": platform.python_version(), "numpy": np.__version__,
                           "cupy": None, "cuda": None, "nccl": None, "gpus": [], "host": platform.node()}
    if not probe_gpu:
        return env
    try:
        import cupy as cp
    except Exception:
        return env
    env["cupy"] = cp.__version__
    try:
        v = cp.cuda.runtime.runtimeGetVersion()
        env["cuda"] = f"{v // 1000}.{v % 1000 // 10}"
        for d in range(cp.cuda.runtime.getDeviceCount()):
            name = cp.cuda.runtime.getDeviceProperties(d)["name"]
            env["gpus"].append(name.decode() if isinstance(name, bytes) else str(name))
    except Exception:
        pass
    try:
        from cupy.cuda import nccl

        v = nccl.get_version()
        env["nccl"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
    except Exception:
        pass
    return env


def run_record(outcome, timings: Mapping[str, float], *, gpus: Any = None, seed: int | None = None,
               key_seed: int | None = None) -> dict[str, Any]:
    """The record of one :class:`~caramel.api.RunOutcome` (no environment: see :func:`document`)."""
    report = outcome.report
    return {
        "program": outcome.program.name,
        "n": int(outcome.ctx.n),
        "mode": outcome.mode.value,
        "backend": outcome.backend,
        "fused": outcome.fused,
        "devices": gpus,
        "seed": seed,
        "key_seed": key_seed,
        "digest": outcome.digest,
        "passed": None if report is None else bool(report.passed),
        "checks": check_record(report),
        "timings_s": {k: round(float(v), 6) for k, v in timings.items()},
    }


def document(kind: str, body: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A whole JSON document: ``{"caramel": SCHEMA, "kind": kind, **body, "environment": ...}``."""
    return {"caramel": SCHEMA, "kind": kind, **body, "environment": dict(env) if env is not None else environment()}


def profile_document(result) -> dict[str, Any]:
    """``caramel profile PROGRAM --json``: the figures of its table (every variant's ms, the time
    per kernel kind), ``timings_s`` (each variant's median run and its setup) and the environment."""
    from caramel.profile import kind_table

    variants = [asdict(v) for v in result.variants]
    kinds = [{"kind": k, "kernels": c, "rows": r, "ms": ms, "share": share}
             for k, c, r, ms, share in kind_table(result.kernels)]
    setup = getattr(result, "setup_s", {}) or {}
    timings = {f"{v.name}": v.median_ms / 1e3 for v in result.variants}
    timings.update({f"{k} setup": float(t) for k, t in setup.items()})
    body = {"program": result.program, "n": result.n, "mode": result.mode, "backend": result.backend,
            "devices": 1, "device": result.device, "clock": result.clock, "date": result.date,
            "variants": variants, "kinds": kinds, "critical_path_ms": getattr(result, "critical_ms", 0.0),
            "timings_s": timings}
    return document("profile", body)


def scaling_document(result) -> dict[str, Any]:
    """``caramel profile FAMILY --gpus ... --json``: one entry per device count (the table's
    figures), the throughput points when measured, ``timings_s`` (median run per G) and the environment."""
    points = []
    for p in result.points:  # a point not measured (a prediction alone): speedup and efficiency None
        s = result.speedup(p)
        points.append({**asdict(p), "speedup": s, "efficiency": None if s is None else s / p.gpus})
    body = {"family": result.family, "n": result.n, "mode": result.mode, "backend": result.backend,
            "devices": [p.gpus for p in result.points], "device": result.device, "clock": result.clock,
            "date": result.date, "points": points,
            "throughput": [asdict(t) for t in getattr(result, "throughput", [])],
            "timings_s": {f"{p.gpus} devices": p.median_ms / 1e3 for p in result.points if p.median_ms is not None}}
    return document("scaling", body)


def json_text(data: Mapping[str, Any]) -> str:
    """``data`` as strict JSON text (indented), as :func:`write_json` writes it."""
    return json.dumps(data, indent=2, allow_nan=False, default=_jsonable)


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """``data`` as strict JSON (indented) at ``path``, atomically."""
    return write_atomic(path, json_text(data) + "\n")


def _jsonable(x: Any) -> Any:
    import numpy as np

    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return _bits(float(x))
    if isinstance(x, (tuple, set, frozenset)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


__all__ = ["PHASES", "SCHEMA", "Timings", "check_record", "document", "environment", "profile_document",
           "run_record", "scaling_document", "timings_line", "write_json"]
