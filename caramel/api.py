"""The embedding API: load a program, make a context and keys, bind inputs, run, read outputs.

    >>> import caramel
    >>> program = caramel.load_program("programs/Mul_4L_2c")
    >>> outcome = caramel.run_program(program, n=4096, check="auto", seed=1)
    >>> outcome.report.passed
    True

Lower-level pieces for finer control: :class:`caramel.ring.Context`, :mod:`caramel.ckks`
(secrets, keys, encryption, :func:`~caramel.ckks.bind.bind_inputs`,
:func:`~caramel.ckks.bind.read_outputs`) and the executors in :mod:`caramel.execute`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from caramel.ckks.bind import requirements
from caramel.ckks.check import (
    CheckReport,
    CheckSpec,
    InputSpec,
    OutputSpec,
    PreparedCheck,
    check_path,
    evaluate_check,
    load_check,
    prepare_check,
)
from caramel.ckks.keyset import KeySet, generate_keyset, input_rng
from caramel.errors import CaramelError
from caramel.execute.reference import RunResult, run_reference
from caramel.program import Mem, Program
from caramel.ring import Context, Mode

#: Names accepted by ``backend=``: ``cpu`` (the reference interpreter, instruction by instruction),
#: ``cpu-plan`` (the fused, batched plan on NumPy: bit-identical, fewer passes), ``gpu`` (the plan
#: on one CUDA GPU through CuPy), ``auto`` (``gpu`` when one is usable, else ``cpu``).
BACKENDS = ("auto", "cpu", "cpu-plan", "gpu")


def gpu_available() -> bool:
    """Whether CuPy imports and sees a CUDA device."""
    try:
        from caramel.execute.gpu import gpu_available as probe
    except ImportError:
        return False
    return probe()


def default_spec(program: Program) -> CheckSpec:
    """Random inputs for any program: every input at the fresh scale 2^28, outputs not judged."""
    req = requirements(program)
    inputs = {name: InputSpec(name, need.kind, "S", magnitude=0.5) for name, need in req.inputs.items()}
    outputs = {name: OutputSpec(name, "0", "S") for name in req.outputs}
    return CheckSpec(f"<random inputs for {program.name}>", "", {}, inputs, outputs)


def output_digest(program: Program, memory: Mapping[Mem, np.ndarray]) -> str:
    """SHA-256 over every output limb (manifest order): equal digests mean bit-identical outputs.

    Outputs are named by their position in the manifest, not by the compiler's term names, so that
    two compilations of one program (1 and 2 chips) with bit-identical outputs print the same digest.
    """
    h = hashlib.sha256()
    for position, entry in enumerate(program.manifest.outputs):
        for limb in entry.limbs:
            key = Mem(entry.term, limb)
            h.update(f"output {position} limb {limb}\0".encode())
            if key in memory:
                h.update(np.ascontiguousarray(memory[key], dtype=np.uint32).tobytes())
    return h.hexdigest()


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

    def __repr__(self) -> str:  # short: the outcome holds the program, keys and every limb of the run
        verdict = "not checked" if self.report is None else ("PASS" if self.report.passed else "FAIL")
        return (f"RunOutcome({self.program.name!r}, N = {self.ctx.n}, mode {self.mode.value}, backend "
                f"{self.backend!r}, {self.seconds:.3f} s, {verdict}, digest {self.digest[:16]}...)")


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``gpu`` when one is usable, else ``cpu``; unknown names are errors."""
    if backend not in BACKENDS:
        raise CaramelError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend == "auto":
        return "gpu" if gpu_available() else "cpu"
    return backend


def executor(program: Program, ctx: Context, mode: Mode, backend: str,
             gpus: int | None = None, streams: int | None = None) -> Callable[[Mapping], RunResult]:
    """A function ``memory -> RunResult`` running ``program`` on ``backend``. ``gpus``: devices
    for a multi-chip program (``gpu``: that many GPUs, default one per chip up to those present;
    ``cpu-plan``: that many simulated devices in host threads, default none: one process).
    ``streams``: CUDA streams per GPU (default: the executor's; ``cpu-plan`` devices: a random
    order that that many streams allow)."""
    backend = resolve_backend(backend)
    if backend == "cpu":
        return lambda memory: run_reference(program, ctx, memory, mode)
    from caramel.plan import build_plan

    if backend == "cpu-plan":
        plan = build_plan(program)
        if gpus:
            from caramel.execute.devices import run_on_devices

            return lambda memory: run_on_devices(plan, ctx, memory, mode, gpus, streams=streams or 1)
        from caramel.execute.plan_engine import run_plan

        return lambda memory: run_plan(plan, ctx, memory, mode)
    if not gpu_available():
        raise CaramelError("backend 'gpu' needs CuPy and a CUDA GPU (pip install 'caramel-fhe[cuda12]' or 'caramel-fhe[cuda13]')")
    if len(program.streams) > 1 or gpus:
        from caramel.execute.multi_gpu import run_multi_gpu

        plan = build_plan(program)
        return lambda memory: run_multi_gpu(plan, ctx, memory, mode, gpus, streams=streams)
    from caramel.execute.gpu import DEFAULT_STREAMS, gpu_executor

    return gpu_executor(program, ctx, mode, streams=streams or DEFAULT_STREAMS)


def check_prime_count(program: Program, ctx: Context) -> None:
    """Raise :class:`BindingError` when ``program`` uses a limb index (a base, a sync id's limb, a
    memory limb or a ``bci`` list entry) beyond the context's prime list, naming the first place."""
    from caramel.errors import BindingError

    count = len(ctx.primes)
    for stream in program.streams:
        for ins in stream.instructions:
            limbs = [ins.limb] if ins.limb is not None else []
            limbs += list(ins.in_limbs) + list(ins.out_limbs)
            limbs += [op.limb for op in (ins.dst, *ins.srcs) if isinstance(op, Mem)]
            bad = [l for l in limbs if l >= count]
            if bad:
                raise BindingError(f"{stream.path}:{ins.line}: limb {max(bad)} is beyond the context's {count} "
                                   f"primes (the program needs at least {max(bad) + 1}; ISA.md section 7 has 64)")


def resolve_check(program: Program, check: str | Path | CheckSpec | None) -> CheckSpec | None:
    """The check of a run: ``"auto"`` is ``programs/checks/<Family>.toml`` when it exists (else
    none), a path is loaded, a :class:`CheckSpec` or None is used as is."""
    if check == "auto":
        path = check_path(program.name)
        return load_check(path) if path.exists() else None
    if check is None or isinstance(check, CheckSpec):
        return check
    return load_check(check)


def run_program(
    program: Program,
    *,
    n: int = 65536,
    mode: Mode | str = Mode.EXACT,
    backend: str = "auto",
    seed: int = 0,
    check: str | Path | CheckSpec | None = "auto",
    ctx: Context | None = None,
    gpus: int | None = None,
    streams: int | None = None,
    key_seed: int | None = None,
    keys: KeySet | None = None,
) -> RunOutcome:
    """Generate keys, encrypt random inputs, run, decrypt and (with a check) compare.

    ``check="auto"`` uses ``programs/checks/<Family>.toml`` when it exists, else random inputs at
    scale 2^28 with no judgement (BootstrapLike is checked by comparing limbs, not by decryption).
    Everything random comes from seeds, so a run is reproducible: inputs from ``seed``, key
    material (secrets and evaluation keys) from ``key_seed`` (default ``seed``), or ``keys`` as
    given (see :mod:`caramel.ckks.keyset`). ``gpus``, ``streams``: see :func:`executor`.
    """
    from caramel.logs import progress

    mode = Mode(mode)
    ctx = ctx or Context(n=n)
    check_prime_count(program, ctx)
    spec = resolve_check(program, check)
    bar = progress(total=4, desc=f"{program.name}: keys", unit="step")
    if keys is None:
        keys = generate_keyset(program, ctx, seed if key_seed is None else key_seed)
    bar.set_description(f"{program.name}: encrypt")
    bar.update()
    prepared = prepare_check(spec or default_spec(program), program, ctx, rng=input_rng(seed),
                             secrets=keys.secrets, keys=dict(keys.keys))
    backend = resolve_backend(backend)
    bar.set_description(f"{program.name}: plan and run ({backend})")
    bar.update()
    run = executor(program, ctx, mode, backend, gpus, streams)
    start = time.perf_counter()
    result = run(prepared.memory)
    seconds = time.perf_counter() - start
    bar.set_description(f"{program.name}: decrypt and check")
    bar.update()
    report = evaluate_check(prepared, result.memory, mode) if spec is not None else None
    bar.update()
    bar.close()
    return RunOutcome(program, ctx, mode, backend, prepared, result, report, seconds,
                      output_digest(program, result.memory))
