"""The embedding API: load a program, make a context and keys, bind inputs, run, read outputs.

    >>> import caramel
    >>> program = caramel.load_program("programs/Mul_4L_2c")
    >>> outcome = caramel.run_program(program, n=4096, check="auto", seed=1)
    >>> outcome.report.passed
    True
    >>> z = outcome.outputs["z"]  # the decrypted output: N/2 complex slots at its true scale

:func:`run_program` is one instance of a :class:`caramel.Executor` (many instances:
:meth:`~caramel.executor.Executor.submit`, :func:`caramel.run_batch`); how it runs is one
:class:`caramel.options.RunOptions`. Lower-level pieces for finer control:
:class:`caramel.ring.Context`, :mod:`caramel.ckks` (secrets, keys, encryption,
:func:`~caramel.ckks.bind.bind_inputs`, :func:`~caramel.ckks.bind.read_outputs`),
:mod:`caramel.instance` (inputs drawn by parts, the output digest) and the executors in
:mod:`caramel.execute`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from caramel.ckks.check import CheckReport, PreparedCheck
from caramel.errors import ArgumentError
from caramel.execute.result import RunResult
from caramel.instance import (  # noqa: F401 (the API's names for them)
    check_prime_count,
    default_spec,
    input_image,
    load_keyset,
    max_limb,
    output_digest,
    prepare_inputs,
    resolve_check,
    run_setup,
)
from caramel.options import (  # noqa: F401
    BACKENDS,
    RunOptions,
    check_devices,
    devices_used,
    gpu_available,
    key_seed_for,
    resolve_backend,
)
from caramel.program import Program
from caramel.ring import Context, Mode


@dataclass
class RunOutcome:
    """The result of :func:`run_program`."""

    program: Program
    ctx: Context
    mode: Mode
    backend: str
    prepared: PreparedCheck
    result: RunResult
    report: CheckReport | None
    seconds: float
    digest: str
    #: seconds per phase (``keys``, ``encrypt``, ``plan``, ``run``, ``check``; :mod:`caramel.results`)
    timings: dict[str, float] = field(default_factory=dict)
    #: whether the run replayed the fused plan (``RunOptions.fusion``); None on the reference interpreter
    fused: bool | None = None

    @cached_property
    def outputs(self) -> dict[str, np.ndarray]:
        """The run's outputs decrypted, by name: N/2 complex slots each, decoded at the output's true
        scale (the check file's). A run without a check file raises
        :class:`~caramel.userdata.OutputScaleError` (its outputs' scale is unknown)."""
        from caramel.userdata import decrypted_outputs

        return decrypted_outputs(self.prepared, self.result.memory)

    def __repr__(self) -> str:  # short: the outcome holds the program, keys and every limb of the run
        verdict = "not checked" if self.report is None else ("PASS" if self.report.passed else "FAIL")
        return (f"RunOutcome({self.program.name!r}, N = {self.ctx.n}, mode {self.mode.value}, backend "
                f"{self.backend!r}, {self.seconds:.3f} s, {verdict}, digest {self.digest[:16]}...)")


def run_program(program: Program, options: RunOptions | None = None, *, keys=None, inputs: Any = None,
                ctx: Context | None = None, **fields) -> RunOutcome:
    """Generate keys, encrypt random inputs, run, decrypt and (with a check) compare: one instance of
    an :class:`~caramel.executor.Executor`.

    ``options``: a :class:`~caramel.options.RunOptions`, or its fields as keywords (``n``, ``mode``,
    ``backend``, ``seed``, ``key_seed``, ``check``, ``gpus``, ``device_ids``, ``streams``, ``client``,
    ``kernels``, ``shared``). ``check="auto"`` uses ``programs/checks/<Family>.toml`` when it exists,
    else random inputs at scale 2^28 with no judgement (BootstrapLike is checked by comparing limbs,
    not by decryption). Everything random comes from seeds, so a run is reproducible: inputs from
    ``seed``, key material (secrets and evaluation keys) and shared inputs from ``key_seed`` (default
    ``seed``), or ``keys`` as given (see :mod:`caramel.ckks.keyset`). ``inputs``: the user's values
    instead of random ones (a ``.npz``/``.json`` path or a mapping ``{name: values}``,
    :mod:`caramel.userdata`), encoded at the check's scales. ``ctx``: the ring (default
    ``Context(n)``). ``client``: where the client arithmetic (keys, encoding, encryption,
    decryption) runs, "cpu" or "gpu" (default: the GPU when the backend is the GPU); the results are
    the same bit for bit. The outcome's ``timings`` has the seconds of each phase (``keys``,
    ``encrypt``, ``plan``: the executor and its devices, ``run``, ``check``: the digest and the check).
    """
    from caramel.executor import Executor
    from caramel.logs import counter, phases

    if not isinstance(program, Program):
        raise ArgumentError(f"run_program needs a Program (from caramel.load_program), got {type(program).__name__}")
    opts = RunOptions.of(options, **fields)
    check_devices(program, resolve_backend(opts.backend), opts.gpus)  # one instance: at most one device per chip
    ctx, _, data = run_setup(program, opts.n, ctx, opts.check, inputs)
    supplied = None
    if data is not None:
        from caramel.userdata import instance_values

        supplied = instance_values(data, program, 0)
    bar = phases(3, f"{program.name}: keys, plan and devices")
    counters = {"keys": counter(f"{program.name}: keys", "keys"),
                "run": counter(f"{program.name}: run", "instructions" if resolve_backend(opts.backend) == "cpu"
                               else "calls")}
    shared = {}
    if supplied:
        from caramel.ckks.bind import requirements
        from caramel.options import shared_names

        names = shared_names(opts.shared, requirements(program).kinds())
        shared = {n: supplied.pop(n) for n in names if n in supplied}
    report = (lambda phase, done, total: counters[phase](done, total)) if all(counters.values()) else None
    try:
        with Executor(program, opts, keys=keys, ctx=ctx, shared=shared, workers=1, depth=1, keep_inputs=True,
                      progress=report) as ex:
            bar.set_description(f"{program.name}: encrypt and run ({ex.backend})")
            bar.update()
            result = ex.submit(supplied, seed=opts.seed).result()
            bar.set_description(f"{program.name}: decrypt and check")
            bar.update()
            backend, fused = ex.backend, ex.fused
            image = {**ex.shared_image, **input_image(ex.plan_inputs.req, result.objects)}
        bar.update()
    finally:
        bar.close()
        for c in counters.values():
            if c is not None:
                c.close()
    t = result.timings
    timings = {"keys": ex.timings["keys"], "encrypt": ex.timings["shared"] + t.get("encrypt", 0.0),
               "plan": ex.timings["plan"], "run": t.get("run", 0.0),
               "check": t.get("digest", 0.0) + t.get("check", 0.0)}
    prepared = result.prepared
    prepared.memory = image
    memory = {**image, **result.memory}
    run = RunResult(_chip_stores(program, result.memory), memory, program.instruction_count)
    return RunOutcome(program, ctx, opts.mode, backend, prepared, run, result.report, timings["run"], result.digest,
                      timings, fused)


def _chip_stores(program: Program, outputs) -> list[dict]:
    """Per chip, the limbs of ``outputs`` that its stream stores (a limb stored by several chips: the
    last chip's, as :meth:`RunResult.from_stores` merges them)."""
    from caramel.program import STORES

    chip_of = {}
    for c, stream in enumerate(program.streams):
        for ins in stream.instructions:
            if ins.op in STORES:
                chip_of[ins.dst] = c
    stores: list[dict] = [{} for _ in program.streams]
    for m, a in outputs.items():
        if m in chip_of:
            stores[chip_of[m]][m] = a
    return stores
