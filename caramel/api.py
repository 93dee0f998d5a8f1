"""The embedding API: load a program, make a context and keys, bind inputs, run, read outputs.

    >>> import caramel
    >>> program = caramel.load_program("programs/Mul_4L_2c")
    >>> outcome = caramel.run_program(program, n=4096, check="auto", seed=1)
    >>> outcome.report.passed
    True
    >>> z = outcome.outputs["z"]  # the decrypted output: N/2 complex slots at its true scale

Lower-level pieces for finer control: :class:`caramel.ring.Context`, :mod:`caramel.ckks`
(secrets, keys, encryption, :func:`~caramel.ckks.bind.bind_inputs`,
:func:`~caramel.ckks.bind.read_outputs`) and the executors in :mod:`caramel.execute`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

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
from caramel.ckks.device import host_array, keeping_inputs, resolve as client_device, using as using_client
from caramel.ckks.keyset import KeySet, generate_keyset, input_rng
from caramel.errors import ArgumentError, BindingError, CaramelError
from caramel.execute.reference import run_reference
from caramel.execute.result import RunResult
from caramel.program import Mem, Program
from caramel.ring import Context, Mode

#: Names accepted by ``backend=``: ``cpu`` (the reference interpreter, instruction by instruction),
#: ``cpu-plan`` (the fused, batched plan on NumPy: bit-identical, fewer passes), ``gpu`` (the plan
#: on one CUDA GPU through CuPy), ``auto`` (``gpu`` when one is usable, else ``cpu``).
BACKENDS = ("auto", "cpu", "cpu-plan", "gpu")


def gpu_available() -> bool:
    """Whether CuPy imports and sees a CUDA device."""
    try:
        from caramel.backends.cuda import available
    except ImportError:
        return False
    return available()


def default_spec(program: Program) -> CheckSpec:
    """Random inputs for any program: every input at the fresh scale 2^28, outputs not judged."""
    req = requirements(program)
    inputs = {name: InputSpec(name, need.kind, "S", magnitude=0.5) for name, need in req.inputs.items()}
    outputs = {name: OutputSpec(name, "0", "S") for name in req.outputs}
    return CheckSpec(f"<random inputs for {program.name}>", "", {}, inputs, outputs, scales_known=False)


def prepare_inputs(program: Program, ctx: Context, keys: KeySet, seed: int, spec: CheckSpec | None = None,
                   supplied: Mapping | None = None) -> PreparedCheck:
    """The input image of one run: ``spec``'s inputs (default :func:`default_spec`), drawn from
    :func:`~caramel.ckks.keyset.input_rng` (``seed``) or the user's ``supplied`` values, encrypted
    under ``keys``, with ``keys``' evaluation keys bound (the client's current device does the
    arithmetic)."""
    from collections import ChainMap  # keys added by binding go to the first map; the key set is read lazily

    return prepare_check(spec or default_spec(program), program, ctx, rng=input_rng(seed), secrets=keys.secrets,
                         keys=ChainMap({}, keys.keys), supplied=supplied)


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
                h.update(np.ascontiguousarray(host_array(memory[key]), dtype=np.uint32).tobytes())
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
    #: seconds per phase (``keys``, ``encrypt``, ``plan``, ``run``, ``check``; :mod:`caramel.results`)
    timings: dict[str, float] = field(default_factory=dict)

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


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``gpu`` when one is usable, else ``cpu``; unknown names are errors."""
    if backend not in BACKENDS:
        raise CaramelError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend == "auto":
        return "gpu" if gpu_available() else "cpu"
    return backend


def executor(program: Program, ctx: Context, mode: Mode, backend: str,
             gpus: int | None = None, streams: int | None = None, *,
             progress: Callable[[int, int], None] | None = None) -> Callable[[Mapping], RunResult]:
    """A function ``memory -> RunResult`` running ``program`` on ``backend``. ``gpus``: devices
    for a multi-chip program (``gpu``: that many GPUs, default one per chip up to those present;
    ``cpu-plan``: that many simulated devices in host threads, default none: one process).
    ``streams``: CUDA streams per GPU (default: the executor's; ``cpu-plan`` devices: a random
    order that that many streams allow). ``progress(done, total)``: called as the ``cpu``
    (instructions) and one-device ``cpu-plan`` (calls) runs go on."""
    backend = resolve_backend(backend)
    check_devices(program, backend, gpus)
    if backend == "cpu":
        return lambda memory: run_reference(program, ctx, memory, mode, progress=progress)
    if backend == "gpu" and not gpu_available():
        raise CaramelError("backend 'gpu' needs CuPy and a CUDA GPU (in the caramel clone: pip install -e '.[cuda12]' or '.[cuda13]')")
    from caramel.plan_cache import cached_plan

    plan = cached_plan(program)  # build_plan(program), or its entry in the plan cache
    if backend == "cpu-plan":
        from caramel.execute.drive import run_on_devices, run_plan

        if gpus:
            return lambda memory: run_on_devices(plan, ctx, memory, mode, gpus, streams=streams or 1)
        return lambda memory: run_plan(plan, ctx, memory, mode, progress=progress)
    from caramel.execute.cuda_graph import GRAPH_STREAMS, gpu_executor, run_multi_gpu

    if len(plan.chips) > 1 or gpus:
        return lambda memory: run_multi_gpu(plan, ctx, memory, mode, gpus, streams=streams)
    return gpu_executor(plan, ctx, mode, streams=streams or GRAPH_STREAMS)


def key_seed_for(seed: int, key_seed: int | None) -> int:
    """The seed of a run's secrets and evaluation keys: ``key_seed`` when given, else the run's
    ``seed`` (``caramel run --seed S`` uses key seed S; its inputs always come from S)."""
    return seed if key_seed is None else key_seed


def check_devices(program: Program, backend: str, gpus: int | None) -> None:
    """Refuse a device count that the run would ignore or could not use: ``gpus`` with the ``cpu``
    backend (the reference interpreter runs in one host thread), fewer than 1, or more devices than
    the program has chips (each device runs at least one chip)."""
    if gpus is None:
        return
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ArgumentError(f"gpus must be a positive integer, got {gpus!r}")
    if backend == "cpu":
        raise ArgumentError("gpus has no effect with backend 'cpu' (the reference interpreter runs in one host "
                            "thread): use backend 'cpu-plan' (simulated devices) or 'gpu'")
    if gpus > program.chips:
        raise ArgumentError(f"{gpus} devices for {program.name}, a {program.chips}-chip program: a run can use at "
                            f"most {program.chips} (one chip per device at least)")


def devices_used(program: Program, backend: str, gpus: int | None) -> int:
    """How many devices a run of ``program`` on ``backend`` (resolved) uses: ``gpus`` when given,
    else 1 on ``cpu``/``cpu-plan`` and on ``gpu`` one per chip, at most the GPUs present."""
    if gpus is not None:
        return gpus
    if backend != "gpu" or program.chips == 1:
        return 1
    import cupy as cp

    return min(program.chips, cp.cuda.runtime.getDeviceCount())


def check_prime_count(program: Program, ctx: Context) -> None:
    """Raise :class:`BindingError` when ``program`` uses a limb index (a base, a sync id's limb, a
    memory limb or a ``bci`` list entry) beyond the context's prime list, naming the first place."""
    count = len(ctx.primes)
    if max_limb(program) < count:  # the usual case: one cheap pass (it runs before the first GPU work)
        return
    for stream in program.streams:
        for ins in stream.instructions:
            limbs = [ins.limb] if ins.limb is not None else []
            limbs += list(ins.in_limbs) + list(ins.out_limbs)
            limbs += [op.limb for op in (ins.dst, *ins.srcs) if isinstance(op, Mem)]
            bad = [l for l in limbs if l >= count]
            if bad:
                raise BindingError(f"{stream.path}:{ins.line}: limb {max(bad)} is beyond the context's {count} "
                                   f"primes (the program needs at least {max(bad) + 1}; ISA.md section 7 has 64)")


def max_limb(program: Program) -> int:
    """The largest limb index that ``program`` uses (-1 for none): the maximum over every instruction's
    base, sync id limb (low 16 bits, communication), ``bci``/``rsv`` limb lists and memory operands'
    limbs, in one pass. Never below the largest limb that :func:`check_prime_count` collects
    (``Instruction.limb`` is one of these; a communication instruction with a base counts both), so
    ``max_limb(p) < len(ctx.primes)`` proves that check passes."""
    from caramel.program import OPCODES

    sync_ops = frozenset(op for op, info in OPCODES.items() if info.limb == "sync")
    top = -1
    for stream in program.streams:
        for ins in stream.instructions:
            base, op = ins.base, ins.op
            if base is not None and base > top:
                top = base
            if op in sync_ops and (ins.sync & 0xFFFF) > top:
                top = ins.sync & 0xFFFF
            if ins.in_limbs and max(ins.in_limbs) > top:
                top = max(ins.in_limbs)
            if ins.out_limbs and max(ins.out_limbs) > top:
                top = max(ins.out_limbs)
            dst = ins.dst
            if isinstance(dst, Mem) and dst.limb > top:
                top = dst.limb
            for src in ins.srcs:
                if isinstance(src, Mem) and src.limb > top:
                    top = src.limb
    return top


def resolve_check(program: Program, check: str | Path | CheckSpec | None) -> CheckSpec | None:
    """The check of a run: ``"auto"`` is ``programs/checks/<Family>.toml`` when it exists (else
    none), a path is loaded, a :class:`CheckSpec` or None is used as is."""
    if check == "auto":
        path = check_path(program.name)
        return load_check(path) if path.exists() else None
    if check is None or isinstance(check, CheckSpec):
        return check
    return load_check(check)


def load_keyset(directory: str | Path, program: Program, ctx: Context) -> KeySet:
    """The key store ``directory`` (:mod:`caramel.ckks.keystore`) for ``program`` at ``ctx``: raises
    :class:`~caramel.ckks.keystore.KeyStoreError` when it is no key store, was made for another N or
    other primes, is damaged, or lacks a key the program needs."""
    from caramel.ckks.keystore import load_keys, require_keys

    keyset = load_keys(directory, ctx)
    require_keys(keyset, requirements(program).keys, directory)
    return keyset


def run_setup(program: Program, n: int, ctx: Context | None, check, inputs: Any, batch: int | None = None):
    """What a run (or a batch of ``batch`` instances) needs before its keys: the ring ``ctx``
    (default ``Context(n=n)``, checked against the program's primes), the check spec
    (:func:`resolve_check`) and the user's inputs (:class:`caramel.userdata.InputData`, checked
    against the manifest; None without ``inputs``)."""
    ctx = ctx or Context(n=n)
    check_prime_count(program, ctx)
    spec = resolve_check(program, check)
    data = None
    if inputs is not None:
        from caramel.userdata import as_input_data, check_inputs, value_bound

        data = as_input_data(inputs, value_bound(program, ctx.n // 2, batch))  # a file: bounded before it is read
        check_inputs(data, program, ctx.n // 2, batch=batch)
    return ctx, spec, data


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
    inputs: Any = None,
    device: str | None = None,
) -> RunOutcome:
    """Generate keys, encrypt random inputs, run, decrypt and (with a check) compare.

    ``check="auto"`` uses ``programs/checks/<Family>.toml`` when it exists, else random inputs at
    scale 2^28 with no judgement (BootstrapLike is checked by comparing limbs, not by decryption).
    Everything random comes from seeds, so a run is reproducible: inputs from ``seed``, key
    material (secrets and evaluation keys) from ``key_seed`` (default ``seed``), or ``keys`` as
    given (see :mod:`caramel.ckks.keyset`). ``gpus``, ``streams``: see :func:`executor`.
    ``inputs``: the user's values instead of random ones (a ``.npz``/``.json`` path or a mapping
    ``{name: values}``, :mod:`caramel.userdata`), encoded at the check's scales. The outcome's
    ``timings`` has the seconds of each phase.
    ``device``: where the client arithmetic (keys, encoding, encryption, decryption) runs, "cpu" or
    "gpu" (default: the GPU when the backend is the GPU); the results are the same bit for bit.
    """
    from caramel.logs import counter, phases

    if not isinstance(program, Program):
        raise ArgumentError(f"run_program needs a Program (from caramel.load_program), got {type(program).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    try:
        mode = Mode(mode)
    except ValueError:
        raise ArgumentError(f"mode must be one of {', '.join(m.value for m in Mode)}, got {mode!r}") from None
    ctx, spec, data = run_setup(program, n, ctx, check, inputs)
    supplied = None
    if data is not None:
        from caramel.userdata import instance_values

        supplied = instance_values(data, program, 0)
    client = client_device(device, resolve_backend(backend))
    bar = phases(4, f"{program.name}: keys")
    marks = [time.perf_counter()]
    on_device = client.on_gpu and resolve_backend(backend) == "gpu" and program.chips == 1 and gpus is None
    with using_client(client):
        if keys is None:
            made = counter(f"{program.name}: keys", "keys")
            keys = generate_keyset(program, ctx, key_seed_for(seed, key_seed), background=True,  # GPU: copied back
                                   on_device=on_device, progress=made)  # while encrypting, or kept for a 1-GPU run
            if made is not None:
                made.close()
        marks.append(time.perf_counter())
        bar.set_description(f"{program.name}: encrypt")
        bar.update()
        with keeping_inputs(on_device):  # the 1-GPU executor copies the inputs' rows into its arena there
            prepared = prepare_inputs(program, ctx, keys, seed, spec, supplied)
    marks.append(time.perf_counter())
    backend = resolve_backend(backend)
    bar.set_description(f"{program.name}: plan and run ({backend})")
    bar.update()
    steps = counter(f"{program.name}: run", "instructions" if backend == "cpu" else "calls")
    run = executor(program, ctx, mode, backend, gpus, streams, progress=steps)
    start = time.perf_counter()
    try:
        result = run(prepared.memory)
    finally:
        if steps is not None:
            steps.close()
    seconds = time.perf_counter() - start
    bar.set_description(f"{program.name}: decrypt and check")
    bar.update()
    with using_client(client):
        report = evaluate_check(prepared, result.memory, mode) if spec is not None else None
    bar.update()
    bar.close()
    timings = {"keys": marks[1] - marks[0], "encrypt": marks[2] - marks[1], "plan": start - marks[2],
               "run": seconds, "check": time.perf_counter() - start - seconds}
    return RunOutcome(program, ctx, mode, backend, prepared, result, report, seconds,
                      output_digest(program, result.memory), timings)
