"""The ``caramel`` command: ``validate``, ``stats``, ``run``, ``keys``, ``plan``, ``profile``, ``launch``.

Every subcommand but ``launch`` takes a PROGRAM: a compiled program folder, a ``.tar.xz`` archive
(``a.tar.xz#NAME`` picks one program of several) or a single ``instructions<p>`` file.

One grammar for every subcommand:

* exit codes: 0 success; 1 a decryption check failed (``run``); 2 bad input: a usage error, a
  program that does not parse or is invalid (``validate`` included), a bad file or option (printed
  as ``caramel: error: <message>``, never a traceback); 130 interrupted by Ctrl-C (one line
  ``caramel: interrupted`` on stderr); 141 stdout closed by its reader.
* ``--json FILE`` writes the command's result as JSON to FILE; ``--json -`` prints it on stdout and
  the command's text goes to stderr. Every output option (``--json``, ``--save-outputs``,
  ``--trace``, ``--plot``, ``--dag-json``, ``--dot``) is checked before any work and written by
  :mod:`caramel.outfiles` (regular files only, atomically; two outputs on one path are refused);
  the command prints where it wrote each one.
* ``-q`` keeps stderr to warnings and errors (no progress bars), ``-v`` adds debug lines, before or
  after the subcommand; diagnostics go through the ``caramel`` logger (:mod:`caramel.logs`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from caramel.version import __version__
from caramel.errors import CaramelError, ValidationError

#: Exit codes: success; a decryption check failed; bad input (usage, program, file, option).
EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_ERROR = EXIT_BAD_INPUT
#: 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

_NOT_CHECKED = "not checked: no check file for this family (give one with --check CHECK.toml)"
_PROGRAM_HELP = "compiled program: a folder, an archive (a.tar.xz or a.tar.xz#NAME) or one instructions file"


@dataclass(frozen=True)
class OutputOption:
    """An option that names a file the command writes (:func:`_add_output`)."""

    flag: str
    dest: str
    label: str
    stdout: bool
    suffixes: tuple[str, ...]


def _add_output(p: argparse.ArgumentParser, flag: str, help_text: str, *, metavar: str = "FILE",
                label: str | None = None, stdout: bool = True, suffixes: tuple[str, ...] = ()) -> None:
    """An output option of subcommand ``p``: registered so that :func:`_check_outputs` checks it
    before any work and :func:`_write` writes it (:mod:`caramel.outfiles`). ``stdout``: ``-`` is
    accepted (the result on stdout, the text on stderr)."""
    action = p.add_argument(flag, metavar=metavar, help=help_text + (" ('-': on stdout, the text then on stderr)"
                                                                        if stdout else ""))
    known = p.get_default("outputs") or ()
    p.set_defaults(outputs=(*known, OutputOption(flag, action.dest, label or flag.lstrip("-"), stdout, suffixes)))


def _add_json(p: argparse.ArgumentParser, what: str) -> None:
    _add_output(p, "--json", f"write {what} as JSON to FILE", label="results")


def _outputs(args: argparse.Namespace):
    """The :class:`caramel.outfiles.Output` of every output option given on the command line."""
    from caramel.outfiles import Output

    return [Output(o.flag, getattr(args, o.dest), o.stdout, o.suffixes) for o in getattr(args, "outputs", ())
            if getattr(args, o.dest, None) is not None]


def _reads(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(files, folders) the command reads: the program's files, ``--inputs``, ``--check`` and the key
    store ``--keys`` (a folder read whole); an output may name none of them."""
    from caramel.parse import program_files

    files = [*program_files(args.program)] if getattr(args, "program", None) else []
    files += [getattr(args, name) for name in ("inputs", "check") if getattr(args, name, None)]
    folders = [args.keys] if getattr(args, "keys", None) else []
    return files, folders


def _check_outputs(args: argparse.Namespace) -> bool:
    """Every output path checked before any work (:func:`caramel.outfiles.check_outputs`); True
    when one of them is ``-`` (stdout)."""
    from caramel.outfiles import check_outputs

    files, folders = _reads(args)
    outputs = check_outputs(_outputs(args), reads=files, folders=folders)
    return any(o.to_stdout for o in outputs)


def _write(args: argparse.Namespace, dest: str, data, what: str = "") -> None:
    """Write output option ``dest`` (registered by :func:`_add_output`) and print where it went
    (``what``: a short description, e.g. "12 kernels"); ``-`` writes to the real stdout."""
    from caramel.outfiles import write_output

    option = next(o for o in args.outputs if o.dest == dest)
    path = write_output(getattr(args, dest), data, option.flag, stdout=getattr(args, "stdout", None))
    if path != "-":
        print(f"{option.label}: {what + ' ' if what else ''}written to {path}")


def _emit_json(args: argparse.Namespace, data) -> None:
    """``--json FILE``: ``data`` as strict JSON (:func:`caramel.results.json_text`) to FILE or stdout."""
    if args.json is None:
        return
    from caramel.results import json_text

    _write(args, "json", data if isinstance(data, str) else json_text(data) + "\n")


def key_seed_for(seed: int, key_seed: int | None) -> int:
    """:func:`caramel.api.key_seed_for` (the API is imported when first needed: see :func:`_start_gpu`)."""
    from caramel.api import key_seed_for as seed_for

    return seed_for(seed, key_seed)


def _key_seed(args: argparse.Namespace) -> int | None:
    """The key seed a run reports: the key store's with ``--keys`` (None when it records none;
    :func:`_store_key_seed`), else ``--key-seed`` or ``--seed``."""
    if getattr(args, "keys", None):
        return args.key_seed
    return key_seed_for(args.seed, args.key_seed)


def _store_key_seed(args: argparse.Namespace) -> None:
    """With ``--keys DIR``: the store's key seed becomes the run's (``args.key_seed``), before any
    work; a ``--key-seed`` that disagrees with it, or that it cannot be checked against, is refused."""
    if not getattr(args, "keys", None):
        return
    from caramel.ckks.keystore import read_manifest

    stored = read_manifest(args.keys).get("key_seed")
    stored = stored if isinstance(stored, int) and not isinstance(stored, bool) else None
    if args.key_seed is not None and args.key_seed != stored:
        said = f"key seed {stored}" if stored is not None else "no key seed"
        raise CaramelError(f"--key-seed {args.key_seed}: the key store {args.keys} records {said}; its keys are used "
                           "as they are (leave --key-seed out, or make a store with `caramel keys --seed`)")
    args.key_seed = stored


def _cuda_driver() -> None:
    """The CUDA driver initialised and device 0's primary context made, through ctypes (no GIL held
    while the driver works); CuPy's runtime then finds the context made."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if not cuda.cuInit(0) and not cuda.cuDeviceGet(ctypes.byref(device), 0):
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)


def _cupy_compiler() -> None:
    """CuPy imported, with its run-time compiler module and NVRTC's library (whose version is part of
    every kernel's cache key)."""
    import cupy
    from cupy.cuda import compiler  # noqa: F401

    cupy.cuda.nvrtc.getVersion()


#: What :func:`_start_gpu` runs, each in a thread of its own (name, function).
GPU_START = (("caramel-gpu-driver", _cuda_driver), ("caramel-gpu-import", _cupy_compiler))
#: The early GPU start's threads of this process (:func:`_start_gpu`), started once.
_gpu_start: list[threading.Thread] = []


def _quietly(fn):
    """``fn`` for a thread of :func:`_start_gpu`: an exception ends it without a word."""
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 (no GPU, no CuPy: the run meets and reports it)
            pass
    return run


def _start_gpu(argv: Sequence[str]) -> None:
    """``caramel run ... --backend gpu`` (not ``--distributed``) and ``caramel compile``: before the package's heavy
    imports (NumPy, the client, the planner), start the steps of :data:`GPU_START` in threads: the CUDA
    driver and the GPU's context, and CuPy's import; :func:`caramel.ckks.device.warm_up` goes on from
    there (its ``import cupy`` waits for this one). Off for ``run`` when ``$CARAMEL_GPU_WARMUP`` is "0"."""
    if _gpu_start or not argv or argv[0] not in ("run", "compile"):
        return
    if argv[0] == "run":
        if "--distributed" in argv or any(a == "--cluster" or a.startswith("--cluster=") for a in argv):
            return
        if os.environ.get("CARAMEL_GPU_WARMUP", "1") == "0":
            return
        backend = [b for a, b in zip(argv, argv[1:]) if a == "--backend"] + [
            a.split("=", 1)[1] for a in argv if a.startswith("--backend=")]
        if backend[-1:] != ["gpu"]:
            return
    for name, fn in GPU_START:
        _gpu_start.append(threading.Thread(target=_quietly(fn), name=name, daemon=True))
        _gpu_start[-1].start()


def _add_keys(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keys", metavar="DIR", help="load the secrets and evaluation keys from the key store DIR "
                   "(made by `caramel keys`) instead of generating them")


#: ``plan --dot`` refuses programs with more instructions than this before writing anything.
DOT_MAX_NODES = 2000


def _load(args: argparse.Namespace, defer_write: bool = False):
    from caramel.parse import load_program

    return load_program(args.program, cache=not args.no_cache, progress=False if args.quiet else None,
                        defer_write=defer_write)


def cmd_validate(args: argparse.Namespace) -> int:
    """``caramel validate PROGRAM``: parse, run the static checks, print ``ok`` or every problem
    (an invalid program is bad input: exit 2, like one that does not parse)."""
    from caramel.validate import validate

    program = _load(args)
    summary = {"program": program.name, "path": str(args.program), "chips": program.chips,
               "instructions": program.instruction_count, "ok": True, "problems": [], "truncated": False}
    try:
        validate(program, limit=args.limit)
    except ValidationError as exc:
        summary.update(ok=False, problems=[str(p) for p in exc.problems], truncated=bool(exc.truncated))
        for problem in exc.problems:
            print(problem)
        more = f" (stopped at {args.limit}; use --limit to see more)" if exc.truncated else ""
        print(f"{len(exc.problems)}{'+' if exc.truncated else ''} error(s) in {args.program}{more}")
        _emit_json(args, summary)
        return EXIT_BAD_INPUT
    print(f"ok: {program.instruction_count} instructions on {program.chips} chip{'s' if program.chips != 1 else ''}")
    _emit_json(args, summary)
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    """``caramel stats PROGRAM``: per-chip instruction mix, registers, limbs and traffic."""
    from caramel.stats import program_stats, render_table

    stats = program_stats(_load(args), n=args.n)
    print(render_table(stats))
    _emit_json(args, stats.to_dict())
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """``caramel run PROGRAM``: the whole chain on one backend; exit 1 when a check fails."""
    if args.save_limbs and not args.save_outputs:
        raise CaramelError("--save-limbs goes with --save-outputs FILE.npz")
    if args.backend == "gpu" and not args.distributed and not args.cluster:  # (a cluster's workers compute)
        from caramel.ckks.device import warm_up

        warm_up(args.n, args.mode)  # CUDA context, the client's kernels and the ring's, while loading and planning
    load_s = time.perf_counter()
    _store_key_seed(args)  # a --key-seed that the key store contradicts is refused before any work
    program = _load(args, defer_write=True)  # a first parse's cache entry waits for the plan (the executor's)
    try:
        return _run_loaded(args, program, load_s)
    finally:
        from caramel.cache import write_deferred

        write_deferred(program)


def _run_loaded(args: argparse.Namespace, program, load_s: float) -> int:
    """``caramel run`` of a loaded ``program`` (:func:`cmd_run`)."""
    from caramel.api import run_program
    from caramel.validate import validate
    from caramel.cache import validate_once

    validate_once(program, validate)  # a program that passed once is not validated again
    load_s = time.perf_counter() - load_s
    check = None if args.no_check else (args.check or "auto")
    if args.save_outputs and not args.save_limbs:  # before keys and the run: decoded at a known scale or not at all
        from caramel.api import resolve_check
        from caramel.userdata import scale_unknown_message

        if resolve_check(program, check) is None:
            raise CaramelError(f"--save-outputs: {scale_unknown_message(program.name)}")
    if args.distributed:
        _check_process_mode(args)
    if args.batch is not None:
        return _run_batch(args, program, check, load_s)
    if args.distributed:
        return _run_distributed(args, program, check)
    if args.cluster:
        return _run_cluster(args, program, check)
    from caramel.api import check_devices, devices_used, resolve_backend

    check_devices(program, resolve_backend(args.backend), args.gpus)  # before keys and inputs are made
    keys_s = time.perf_counter()
    keys, ctx = _stored_keys(args, program, background=True)  # key files read on while the inputs are encrypted
    keys_s = time.perf_counter() - keys_s
    outcome = run_program(program, _run_options(args, check), inputs=args.inputs, ctx=ctx, keys=keys)
    if keys is not None:
        outcome.timings["keys"] += keys_s  # loading the key store (--keys DIR) is the keys phase
    gpus = devices_used(program, outcome.backend, args.gpus)
    print(f"{program.name}: {program.instruction_count} instructions on {program.chips} chip(s), N = {args.n}, "
          f"mode {args.mode}, backend {outcome.backend} on {gpus} device(s){KERNELS_NOTE[outcome.fused]}: ran in "
          f"{outcome.seconds:.2f} s")
    print(f"output digest (sha256): {outcome.digest}")
    _run_results(args, outcome, load_s, gpus)
    if outcome.report is None:
        print(_NOT_CHECKED)
        return EXIT_OK
    print(outcome.report.summary())
    return EXIT_OK if outcome.report.passed else EXIT_CHECK_FAILED


#: What a run's line says of its plan (:attr:`caramel.api.RunOutcome.fused`; None: the reference, no plan).
KERNELS_NOTE = {True: ", fused kernels", False: ", one kernel per instruction", None: ""}


def _run_cluster(args: argparse.Namespace, program, check) -> int:
    """``caramel run PROGRAM --cluster ADDRESS`` without ``--batch``: one run of a K-chip program,
    one chip per worker (:meth:`caramel.cluster.ClusterExecutor.run_partitioned`)."""
    from caramel.cluster import ClusterExecutor

    if args.keys or args.inputs or args.save_outputs or args.json:
        raise CaramelError("--keys, --inputs, --save-outputs and --json go with --batch on a cluster")
    with ClusterExecutor(program, _run_options(args, check), cluster=args.cluster) as pool:
        run = pool.run_partitioned()
    print(f"{program.name}: {program.instruction_count} instructions on {program.chips} chip(s), N = {args.n}, "
          f"mode {args.mode}, backend {run.backend}, {run.ranks} rank(s) on {run.ranks} Dask worker(s): ran in "
          f"{run.seconds:.2f} s")
    print(f"output digest (sha256): {run.digest}")
    if run.report is None:
        print(_NOT_CHECKED)
        return EXIT_OK
    print(run.report.summary())
    return EXIT_OK if run.report.passed else EXIT_CHECK_FAILED


def _run_results(args: argparse.Namespace, outcome, load_s: float, gpus: int) -> None:
    """The time breakdown line of a run, and ``--save-outputs`` / ``--json`` (:mod:`caramel.results`)."""
    from caramel.results import document, run_record, timings_line

    timings = {"load": load_s, **outcome.timings}
    if args.save_outputs or args.save_limbs:
        from caramel.userdata import decrypted_outputs

        t0 = time.perf_counter()
        arrays = decrypted_outputs(outcome.prepared, outcome.result.memory, limbs=args.save_limbs)
        timings["decrypt"] = time.perf_counter() - t0
        if args.save_outputs:
            _save_outputs(args, arrays)
            if outcome.report is None:
                print("outputs: the limbs alone (no check file: the outputs' scale is unknown, their slots are not "
                      "decoded)")
    print(timings_line(timings))
    if args.json:
        record = run_record(outcome, timings, gpus=gpus, seed=args.seed, key_seed=_key_seed(args))
        record["inputs"] = args.inputs
        _emit_json(args, document('run', record))


def _run_options(args: argparse.Namespace, check, **fields):
    """The :class:`~caramel.options.RunOptions` of ``caramel run`` (``fields`` replace its own)."""
    from caramel.options import RunOptions

    values = dict(n=args.n, mode=args.mode, backend=args.backend, seed=args.seed, key_seed=args.key_seed,
                  check=check, gpus=args.gpus, streams=args.streams, shared=getattr(args, "shared", None) or (),
                  fusion=args.fusion or ("auto" if args.batch is None else "on"))
    return RunOptions(**{**values, **fields})


#: Phases of an instance of a batch, in the order they happen (printed after :data:`caramel.results.PHASES`).
INSTANCE_PHASES = ("upload", "replay", "download", "digest")


def _run_batch(args: argparse.Namespace, program, check, load_s: float) -> int:
    """``caramel run --batch B``: B instances (:mod:`caramel.batch`), one line each and a summary;
    with ``--distributed`` this process's share, rank 0 gathering and printing; with ``--cluster``
    on a Dask cluster. The instances that finished are printed (and their outputs saved) even when
    others failed (exit 2) or the batch was interrupted (exit 130)."""
    from caramel.batch import instance_line, run_batch, run_batch_distributed
    from caramel.results import PHASES, document, timings_line
    from caramel.userdata import stack_outputs

    keep = bool(args.save_outputs or args.save_limbs)
    options = _run_options(args, check)
    # A cluster's workers get the keys from the host; one process reads them on while its setup goes on.
    keys, _ = _stored_keys(args, program, background=not args.cluster)
    if args.distributed:
        from caramel.api import resolve_backend
        from caramel.execute.rendezvous import open_rendezvous

        place = _place()
        backend = "gpu" if resolve_backend(args.backend) == "gpu" else "cpu-plan"
        with open_rendezvous(place) as rdv:  # the others hear of a failure here (Rendezvous.fail)
            rdv.meet(_identity(args, program, check, place.world, backend, args.batch), MEET_SECONDS)
            gathered = run_batch_distributed(program, place, rdv, options.with_(gpus=None, backend=backend),
                                             batch=args.batch, inputs=args.inputs, outputs=keep,
                                             limbs=args.save_limbs, keys=keys)
        if gathered is None:
            return EXIT_OK
        result, arrays = gathered.result, gathered.outputs
    elif args.cluster:
        from caramel.cluster import ClusterExecutor

        with ClusterExecutor(program, options, cluster=args.cluster, keys=keys, batch=args.batch, inputs=args.inputs,
                             outputs=keep, limbs=args.save_limbs) as pool:
            result = pool.run_batch(args.batch)
        arrays = stack_outputs([x.outputs for x in result.instances]) if keep and result.instances else None
    else:
        result = run_batch(program, options, batch=args.batch, keys=keys, inputs=args.inputs, outputs=keep,
                           limbs=args.save_limbs)
        arrays = stack_outputs([x.outputs for x in result.instances]) if keep and result.instances else None
    shared = f", shared {', '.join(result.shared)}" if result.shared else ""
    print(f"{program.name}: {program.instruction_count} instructions on {program.chips} chip(s), N = {args.n}, "
          f"mode {args.mode}, backend {result.backend}, batch {args.batch} (seed {args.seed} + i, "
          f"{_key_seed_words(args)}{shared})")
    lines = [(r["instance"], instance_line(r)) for r in result.records]
    lines += [(i, f"instance {i}: FAILED: {error}") for i, error in result.failed.items()]
    for _, line in sorted(lines):
        print(line)
    print(result.summary.line())
    totals = {"load": load_s, **result.timings}
    for record in result.records:  # per-instance phases, summed over the instances
        for phase, seconds in record["timings_s"].items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    order = [k for k in (*PHASES, *INSTANCE_PHASES) if k in totals]
    print(timings_line({k: totals[k] for k in order}) + " (instances' phases summed)")
    if arrays is not None and args.save_outputs:
        _save_outputs(args, arrays)
    if args.json:
        body = result.body()
        body["key_seed"] = _key_seed(args)
        body["timings_s"] = {"load": round(load_s, 6), **body["timings_s"]}
        body["inputs"] = args.inputs
        _emit_json(args, document('batch', body))
    if result.interrupted:
        done = ", ".join(str(r["instance"]) for r in result.records) or "none"
        print(f"caramel: interrupted: {len(result.records)} of {args.batch} instance(s) finished ({done})",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.failed:
        print(f"caramel: error: {len(result.failed)} instance(s) failed: "
              + "; ".join(f"instance {i}: {e}" for i, e in sorted(result.failed.items())), file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK if result.passed else EXIT_CHECK_FAILED


def _key_seed_words(args: argparse.Namespace) -> str:
    """"key seed K" of a run's header, "key seed K (key store DIR)" with ``--keys``."""
    seed = _key_seed(args)
    said = f"key seed {seed}" if seed is not None else "key seed not recorded"
    return f"{said} (key store {args.keys})" if getattr(args, "keys", None) else said


def _save_outputs(args: argparse.Namespace, arrays) -> None:
    """``--save-outputs FILE.npz``: the decrypted outputs (:mod:`caramel.userdata`)."""
    from caramel.userdata import npz_writer

    _write(args, "save_outputs", npz_writer(arrays), ", ".join(sorted(arrays)))


def _stored_keys(args: argparse.Namespace, program, background: bool = False):
    """(KeySet, Context) from ``--keys DIR``, or (None, None) without it. ``background``: the
    evaluation keys' files are read by threads while the caller goes on
    (:func:`caramel.ckks.keystore.load_keys`); the secrets, the manifest and the key ids are checked here."""
    if getattr(args, "keys", None) is None:
        return None, None
    from caramel.api import load_keyset
    from caramel.ring import Context

    ctx = Context(n=args.n)
    if background:
        from caramel.ckks.bind import requirements
        from caramel.ckks.keystore import load_keys, require_keys

        # Keys copied up while read, by loader threads on the current device: one GPU of one process (a rank of
        # process mode runs on its LOCAL_RANK's device, which those threads do not use: it reads on the host).
        one_gpu = (args.backend == "gpu" and program.chips == 1 and args.gpus is None
                   and not getattr(args, "distributed", False))
        keyset = load_keys(args.keys, ctx, background=True, on_device=one_gpu)
        require_keys(keyset, requirements(program).keys, args.keys)
        return keyset, ctx
    return load_keyset(args.keys, program, ctx), ctx


def cmd_keys(args: argparse.Namespace) -> int:
    """``caramel keys PROGRAM --out DIR``: write the secrets and every evaluation key the program needs."""
    from caramel.ckks.bind import requirements
    from caramel.ckks.keyset import generate_keyset
    from caramel.ckks.keystore import check_target, save_keys
    from caramel.logs import counter
    from caramel.ring import Context

    check_target(args.out)  # a folder that is not new, empty or caramel's store: refused before any work
    program = _load(args)
    ctx = Context(n=args.n)
    start = time.perf_counter()
    device = args.device
    if device == "auto":
        from caramel.api import gpu_available

        device = "gpu" if gpu_available() else "cpu"
    count = len(requirements(program).keys)
    logging.getLogger("caramel.keys").info("%s: making the secrets and %d evaluation keys at N = %d on the %s",
                                           program.name, count, args.n, device)
    bar = counter(f"{program.name}: keys", "keys")
    keyset = generate_keyset(program, ctx, args.seed, device=device, progress=bar)
    if bar is not None:
        bar.close()
    made = time.perf_counter() - start
    logging.getLogger("caramel.keys").info("%s: made in %.1f s; writing %s", program.name, made, args.out)
    bar = counter(f"{program.name}: write", "keys")
    save_keys(keyset, ctx, args.out, key_seed=args.seed, program=program.name,
              progress=None if bar is None else lambda done: bar(done, count))
    if bar is not None:
        bar.close()
    size = sum(k.c0.nbytes + k.c1.nbytes for k in keyset.keys.values())
    print(f"{program.name}: {len(keyset.keys)} evaluation keys ({size / 2**30:.2f} GiB) at N = {args.n}, key seed "
          f"{args.seed}: made in {made:.1f} s, written to {args.out} in {time.perf_counter() - start - made:.1f} s")
    print(f"{args.out} holds the SECRET KEY (secrets {keyset.secrets.describe()}): keep it private")
    return EXIT_OK


#: Seconds the ranks of a process-mode run wait for each other to meet.
MEET_SECONDS = 300.0


def _place():
    """This process's place in a process-mode run (launcher variables), or a clear error."""
    from caramel.execute.distributed import launch_env

    place = launch_env()
    if place is None:
        raise CaramelError("--distributed needs a launcher's RANK/WORLD_SIZE variables (see `caramel launch`)")
    return place


def _identity(args: argparse.Namespace, program, check, world: int, backend: str, batch: int | None = None):
    """What every rank of a process-mode run must agree on (:class:`caramel.execute.rendezvous.RunIdentity`)."""
    from caramel.api import resolve_check
    from caramel.execute.distributed import RunIdentity, check_digest
    from caramel.options import ranks_fuse
    from caramel.parse import read_source, source_digest

    return RunIdentity(source_digest(read_source(args.program)), args.n, args.mode, args.seed, world, backend,
                       check_digest(resolve_check(program, check)), args.key_seed, batch,
                       ranks_fuse(getattr(args, "fusion", None)))


def _run_distributed(args: argparse.Namespace, program, check) -> int:
    """``caramel run --distributed``: this process's GPU of a multi-process run (launcher
    variables, :mod:`caramel.execute.distributed`); rank 0 gathers, checks and prints."""
    from caramel.api import output_digest, prepare_inputs, resolve_backend, run_setup
    from caramel.ckks.check import evaluate_check
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.distributed import run_distributed
    from caramel.execute.rendezvous import open_rendezvous
    from caramel.options import ranks_fuse
    from caramel.plan import build_plan
    from caramel.ring import Mode

    place = _place()
    # Processes run the plan: on their GPU, or (cpu, cpu-plan, auto without a GPU) on NumPy.
    backend = "gpu" if resolve_backend(args.backend) == "gpu" else "cpu-plan"
    with open_rendezvous(place) as rdv:  # the others hear of a failure here (Rendezvous.fail)
        rdv.meet(_identity(args, program, check, place.world, backend), MEET_SECONDS)  # before the keys: seconds
        ctx, spec, _ = run_setup(program, args.n, None, check, None)
        # the keys and inputs of `caramel run --seed S [--key-seed K]` (caramel.ckks.keyset), so the digests agree
        keys = generate_keyset(program, ctx, key_seed_for(args.seed, args.key_seed))
        prepared = prepare_inputs(program, ctx, keys, args.seed, spec)
        plan = build_plan(program, fuse=ranks_fuse(args.fusion))
        result = run_distributed(plan, ctx, prepared.memory, Mode(args.mode), place, rdv, backend=backend,
                                 streams=args.streams)
    if result is None:
        return EXIT_OK
    print(f"{program.name}: {program.instruction_count} instructions on {program.chips} chip(s), N = {args.n}, "
          f"mode {args.mode}, {place.world} processes")
    print(f"output digest (sha256): {output_digest(program, result.memory)}")
    if spec is None:
        print(_NOT_CHECKED)
        return EXIT_OK
    report = evaluate_check(prepared, result.memory, Mode(args.mode))
    print(report.summary())
    return EXIT_OK if report.passed else EXIT_CHECK_FAILED


#: The commands that ``caramel launch`` starts in process mode.
LAUNCHABLE = ("run", "profile")


def cmd_launch(args: argparse.Namespace) -> int:
    """``caramel launch --nproc G -- ARGS``: G local processes of ``caramel ARGS --distributed``.

    Before any process starts: the command must be one of :data:`LAUNCHABLE` and parse (with
    ``--distributed``), the program must have at least G chips, the options must suit process
    mode, every output path must be writable, and ``--backend gpu`` needs CuPy and G GPUs."""
    from caramel.launch import launch

    rest = [a for a in args.args if a != "--"]
    if not rest:
        print("caramel: error: give the caramel command after --, e.g. caramel launch --nproc 2 -- run PROGRAM "
              "--backend gpu", file=sys.stderr)
        return EXIT_ERROR
    if rest[0] not in LAUNCHABLE:
        raise CaramelError(f"caramel launch starts {' or '.join(LAUNCHABLE)} in process mode, not {rest[0][:40]!r}")
    child = build_parser()
    commands = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction)).choices
    if "--distributed" not in commands[rest[0]]._option_string_actions:
        raise CaramelError(f"`caramel {rest[0]}` has no process mode (no --distributed) in this version; "
                           "`caramel profile FAMILY --gpus 1,2,...` profiles several devices in one process")
    try:
        child_args = child.parse_args([*rest, "--distributed"])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) and exc.code else EXIT_ERROR
    _check_process_mode(child_args)
    _check_outputs(child_args)
    backend = getattr(child_args, "backend", "auto")
    if backend == "gpu":
        _check_gpus(args.nproc)
    program = _load(child_args)
    batch = getattr(child_args, "batch", None)
    if batch is not None and args.nproc > batch:  # program-level: each process runs whole instances
        raise CaramelError(f"--nproc {args.nproc} for a batch of {batch}: use at most {batch} processes "
                           "(one instance per process at least)")
    if batch is None and args.nproc > program.chips:
        raise CaramelError(f"--nproc {args.nproc} for {program.name}, a {program.chips}-chip program: use at most "
                           f"{program.chips} processes (one per chip)")
    return launch(args.nproc, rest, heartbeat_timeout=args.heartbeat_timeout)


def _check_process_mode(args: argparse.Namespace) -> None:
    """Refuse the options that process mode does not take (before any process starts)."""
    if getattr(args, "cluster", None):
        raise CaramelError("--cluster and --distributed are two ways to spread a run: give one")
    if getattr(args, "batch", None) is None and getattr(args, "keys", None):
        raise CaramelError("--keys goes with --batch in process mode (the ranks of one run make their keys)")
    if getattr(args, "batch", None) is None and any(getattr(args, o, None) for o in ("inputs", "save_outputs", "json")):
        raise CaramelError("--inputs, --save-outputs and --json go with --batch in process mode")
    if getattr(args, "batch", None) is None and getattr(args, "shared", None):
        raise CaramelError("--shared goes with --batch in process mode")


def _check_gpus(count: int) -> None:
    """``--backend gpu`` for ``count`` processes: CuPy and at least ``count`` CUDA GPUs here."""
    from caramel.api import gpu_available

    if not gpu_available():
        raise CaramelError("--backend gpu needs CuPy and a CUDA GPU on this machine (in the caramel clone: pip install "
                           "-e '.[cuda12]' or '.[cuda13]'); --backend cpu-plan runs the same processes on the CPU")
    import cupy as cp

    present = cp.cuda.runtime.getDeviceCount()
    if present < count:
        raise CaramelError(f"--nproc {count} processes on the GPU, this machine has {present} GPU(s)")


def cmd_plan(args: argparse.Namespace) -> int:
    """``caramel plan PROGRAM``: instructions -> kernels by kind, traffic, critical path, exports."""
    from caramel.plan import build_plan, dag, plan_stats
    from caramel.plan.report import _bytes, plan_report
    from caramel.validate import validate

    program = _load(args)
    validate(program)
    if args.dot and program.instruction_count > DOT_MAX_NODES:  # before any work or any file
        raise CaramelError(f"--dot: {program.name} has {program.instruction_count} instructions, too many for "
                           f"Graphviz (limit {DOT_MAX_NODES}); use --dag-json")
    loads = False if args.no_ntt_fuse else (args.ntt_loads or True)
    options = {} if args.max_outputs is None else {"max_outputs": args.max_outputs}
    if args.no_aut_fuse:
        options["fuse_automorphism"] = False
    if args.no_epilogue:
        options["fuse_epilogue"] = False
    plan = build_plan(program, fuse=not args.no_fuse, fuse_ntt=loads, **options)
    # the plan's text (on stderr with --json -, whose JSON takes stdout)
    print(plan_report(plan, program, n=args.n))
    if not args.no_fuse and not args.no_aut_fuse:  # what the automorphisms in the loads remove
        plain = plan_stats(build_plan(program, fuse_ntt=loads, **options, fuse_automorphism=False), n=args.n)
        print(f"without automorphisms in their consumers' loads (--no-aut-fuse): plan traffic "
              f"{_bytes(plain['plan_bytes'])}, {plain['by_kind']['automorphism'][1]} automorphism rows")
    if not args.no_fuse and not args.no_ntt_fuse and args.ntt_loads != "all":  # what every NTT load removes
        every = plan_stats(build_plan(program, fuse_ntt="all", **options), n=args.n)
        print(f"with every NTT load (--ntt-loads all, the converting load too): plan traffic "
              f"{_bytes(every['plan_bytes'])}")
    _emit_json(args, plan.to_json())
    if args.dag_json or args.dot:
        graph = dag.program_graph(program)
        if args.dag_json:
            _write(args, "dag_json", json.dumps(dag_node_link(graph, program)), "dependency DAG")
        if args.dot:
            try:
                text = dag.to_dot(graph, program, max_nodes=DOT_MAX_NODES)  # before the file: none left behind
            except ValueError as exc:
                raise CaramelError(f"--dot: {exc}") from None
            _write(args, "dot", text, "dependency DAG")
    return EXIT_OK


def cmd_compile(args: argparse.Namespace) -> int:
    """``caramel compile PROGRAM``: warm every cache a GPU run of PROGRAM needs, ahead of it: the load cache, the plan
    cache (the plan for the CUDA backend) and, where a GPU is, every kernel the run loads at N = ``--n`` in mode
    ``--mode`` on ``--gpus`` devices and every kernel of the GPU client (keys, encryption, decryption), compiled in
    parallel into CuPy's kernel cache: the client's from the start (:func:`caramel.ckks.device.warm_up`, while the
    program loads and plans), the plan's once it exists. Without a GPU the kernels are skipped (exit 0)."""
    from caramel.api import check_devices, gpu_available
    from caramel.backends.cuda.target import CUDA_TARGET
    from caramel.ckks.device import wait_for_warm_up, warm_up
    from caramel.execute.placement import device_programs
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context, Mode
    from caramel.validate import validate

    t0 = time.perf_counter()
    warm_up(args.n, args.mode, always=True)  # the client's kernels and the ring's (a thread; without a GPU: nothing)
    program = _load(args)
    validate(program)
    check_devices(program, "gpu", args.gpus)
    plan = cached_plan(program, target=CUDA_TARGET, cache=not args.no_cache)
    print(f"{program.name}: load and plan caches ready ({plan.kernels} kernels on {len(plan.chips)} chip(s)) in "
          f"{time.perf_counter() - t0:.1f} s")
    if not gpu_available():
        print("kernels skipped: no CUDA GPU here (compiling them needs CuPy and a device)")
        return EXIT_OK
    from caramel.backends.cuda.array_kernels import backend_jobs
    from caramel.backends.cuda.compiler import compile_sources
    from caramel.ckks.gpu_kernels import client_jobs, encoding_jobs
    from caramel.execute.gpu_pipeline import lane_jobs
    from caramel.execute.precompile import precompile

    t0 = time.perf_counter()
    ctx = Context(args.n)
    progs = device_programs(plan, args.gpus or program.chips, ctx.primes, keep_inputs=True)
    modules = precompile(progs, plan, ctx, [Mode(args.mode)], progress=False if args.quiet else None)
    wait_for_warm_up()
    # Mostly compiled by the warm-up already: found in the cache (an error the warm-up only logged is raised here).
    client = compile_sources(client_jobs(ctx) + encoding_jobs() + backend_jobs(ctx.n) + lane_jobs(),
                             progress=False)
    print(f"{modules} kernel modules compiled for N = {args.n}, mode {args.mode}, {len(progs)} device(s), and the GPU "
          f"client's and the executor's {client} other kernels, in {time.perf_counter() - t0:.1f} s")
    return EXIT_OK


def dag_node_link(graph, program) -> dict:
    """The dependency DAG as :func:`networkx.node_link_data` (``edges="edges"``): nodes ``"chip:index"``
    with ``chip``, ``index``, ``line`` and ``text``; edges with ``dep`` (raw, comm, ...). Reload it with
    ``networkx.node_link_graph(json.load(f), edges="edges")``."""
    import networkx as nx

    named = nx.DiGraph(program=program.name)
    for c, i in graph.nodes:
        ins = program.streams[c].instructions[i]
        named.add_node(f"{c}:{i}", chip=c, index=i, line=ins.line, text=ins.text())
    for u, v, d in graph.edges(data=True):
        named.add_edge(f"{u[0]}:{u[1]}", f"{v[0]}:{v[1]}", dep=d.get("dep", "raw"))
    return nx.node_link_data(named, edges="edges")


def cmd_profile(args: argparse.Namespace) -> int:
    """``caramel profile PROGRAM``: eager / graph / graph+fusion timings, time per kernel kind, trace."""
    from caramel.options import RunOptions
    from caramel.profile import chrome_trace, profile_program, render
    from caramel.validate import validate

    log = logging.getLogger("caramel.profile").info
    if args.plot and not args.gpus:
        raise CaramelError("--plot draws the scaling curve of --gpus 1,2,...: give --gpus too")
    if args.gpus:
        return _profile_scaling(args, log)
    program = _load(args)
    validate(program)
    memory = None
    keys, ctx = _stored_keys(args, program)
    if keys is not None and not args.throughput:
        from caramel.api import prepare_inputs

        memory = prepare_inputs(program, ctx, keys, args.seed).memory
    options = RunOptions(n=args.n, mode=args.mode, seed=args.seed, backend=args.backend)
    if args.throughput:
        return _profile_throughput(args, program, options.with_(shared=getattr(args, "shared", None) or ()), keys,
                                   log)
    result = profile_program(program, options, repeats=args.repeats, warmup=args.warmup, log=log, memory=memory)
    print(render(result))
    if args.trace:
        _write(args, "trace", json.dumps(chrome_trace(result)), f"{len(result.kernels)} kernels")
    if args.json:
        from caramel.results import profile_document

        _emit_json(args, profile_document(result))
    return EXIT_OK


def _profile_throughput(args: argparse.Namespace, program, options, keys, log) -> int:
    """``caramel profile PROGRAM --throughput``: instances per second served (shared inputs resident) and
    end to end (every input drawn per instance), and where an instance's time goes."""
    from caramel.profile import profile_throughput, render_throughput

    result = profile_throughput(program, options, instances=args.repeats, keys=keys, log=log)
    print(render_throughput(result))
    if args.json:
        from caramel.results import document

        _emit_json(args, document("throughput", result.body()))
    return EXIT_OK


def _profile_scaling(args: argparse.Namespace, log) -> int:
    """``caramel profile FAMILY --gpus 1,2,4,8``: the scaling table, a PNG plot and a trace."""
    import json

    from caramel.scaling import plot_format, plot_writer, profile_scaling, render_scaling, scaling_trace

    if args.plot:  # before the work: a known format, and matplotlib present
        import importlib.util

        plot_format(args.plot)
        if importlib.util.find_spec("matplotlib") is None:
            raise CaramelError("--plot needs matplotlib: pip install -e '.[plot]' in the caramel clone")
    from caramel.options import RunOptions

    options = RunOptions(n=args.n, mode=args.mode, seed=args.seed, backend=args.backend, streams=args.streams)
    result = profile_scaling(args.program, args.gpus, options, repeats=args.repeats, warmup=args.warmup, log=log,
                             predict_only=args.predict_only)
    if args.throughput:
        from caramel.batch import measure_throughput
        from caramel.parse import load_program
        from caramel.scaling import family_member

        result.throughput = measure_throughput(load_program(family_member(args.program, 1)), args.gpus,
                                               options.with_(backend=result.backend), rounds=args.repeats, log=log)
    print(render_scaling(result))
    if args.json:
        from caramel.results import scaling_document

        _emit_json(args, scaling_document(result))
    if args.plot:
        _write(args, "plot", plot_writer(result, args.plot), "scaling curve")
    if args.trace:
        _write(args, "trace", json.dumps(scaling_trace(result)), f"{len(result.trace)} calls")
    return EXIT_OK


def _gpu_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU counts like 1,2,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive GPU counts like 1,2,4,8, got {text!r}")
    return values


def _integer(least: int, below: int, expected: str):
    """An argparse type: an integer in [least, below), else "expected {expected}" naming the text."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if not least <= value < below:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_positive = _integer(1, 2**63, "a positive integer")
_count = _integer(0, 2**63, "an integer >= 0")
_seed = _integer(0, 2**63, "a seed from 0 to 2^63 - 1")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


#: Largest ring dimension N caramel supports (its primes, ISA.md section 7).
MAX_N = 65536


def _ring_dimension(text: str, least: int | None = None) -> int:
    """``--n`` of ``stats`` and ``plan`` (byte figures only): a power of two from the ring's
    :data:`~caramel.ring.context.MIN_N` (``least``: another floor) to :data:`MAX_N`."""
    from caramel.ring.context import MIN_N

    least = MIN_N if least is None else least
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < least or value & (value - 1) or value > MAX_N:
        raise argparse.ArgumentTypeError(f"N must be a power of two from {least} to {MAX_N} (the ring degrees caramel "
                                         f"supports{' with keys' if least != MIN_N else ''}), got {text!r}")
    return value


def _key_ring_dimension(text: str) -> int:
    """``--n`` of the commands that make keys (``run``, ``keys``, ``profile``): at least the Hamming
    weight of the ephemeral secret (:data:`caramel.ckks.keys.EPHEMERAL_DEFAULT`), so that every N
    that ``--help`` allows makes its secrets."""
    from caramel.ckks.keys import EPHEMERAL_DEFAULT

    return _ring_dimension(text, max(EPHEMERAL_DEFAULT.hamming_weight, 16))


def _add_verbosity(p: argparse.ArgumentParser, default) -> None:
    """``-q``/``-v`` on the top-level parser (``default`` False) and on every subcommand (``default``
    SUPPRESS: given after the subcommand, they set the same values; not given, they leave the top
    level's)."""
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="no progress bars, only warnings and errors on stderr")
    p.add_argument("-v", "--verbose", action="store_true", default=default, help="debug lines on stderr")


#: What every subcommand's ``--help`` ends with: the grammar shared by all of them.
_EPILOG = ("exit status: 0 success, 1 a decryption check failed, 2 bad input (usage, program, file or option).\n"
           "--json FILE writes the result as JSON ('-': on stdout, the text then on stderr); every output\n"
           "path is checked before any work. -q/-v work before or after the subcommand.")

#: What ``--help`` says the default N costs on a CPU (the reference's order of magnitude, not a
#: measurement of any one host).
_CPU_COST = ("on a CPU the default N = 65536 takes tens of seconds for a small program, most of it making keys, "
             "and minutes for a bootstrapping one; --n 4096 checks the same arithmetic in seconds")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``caramel`` command (one subparser per subcommand)."""
    parser = argparse.ArgumentParser(
        prog="caramel",
        description="Interpreter and multi-GPU runtime for the Cinnamon limb-level FHE ISA.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"caramel {__version__}")
    _add_verbosity(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, func, program: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if program:
            p.add_argument("program", metavar="PROGRAM", help=_PROGRAM_HELP)
            p.add_argument("--no-cache", action="store_true", help="parse the files even if a cached parse exists")
        _add_verbosity(p, argparse.SUPPRESS)  # after the subcommand too; the top level's default stays
        p.set_defaults(func=func, outputs=())
        return p

    def key_n(p: argparse.ArgumentParser) -> None:
        p.add_argument("--n", type=_key_ring_dimension, default=MAX_N,
                       help=f"ring dimension N (default {MAX_N}; {_CPU_COST})")

    p = command("validate", "check a compiled program statically (def-use, memory, BCU, communication)",
                cmd_validate)
    p.add_argument("--limit", type=_positive, default=50, help="report at most this many errors (default 50)")
    _add_json(p, "the verdict and every problem")

    p = command("stats", "per-chip instruction counts, registers, limbs, communication and memory traffic",
                cmd_stats)
    p.add_argument("--n", type=_ring_dimension, default=MAX_N, help=f"ring dimension N for byte figures "
                   f"(default {MAX_N})")
    _add_json(p, "the figures")

    p = command("run", "generate keys, encrypt random inputs, run the program, decrypt and check", cmd_run)
    key_n(p)
    p.add_argument("--mode", choices=("exact", "textbook", "emulator"), default="exact",
                   help="arithmetic of base conversion and rescale (ISA.md decision 2; default exact)")
    from caramel.api import BACKENDS  # imported here, after _start_gpu
    from caramel.options import FUSIONS

    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto (a GPU when usable, else cpu), cpu (reference interpreter), cpu-plan (the plan "
                        "on NumPy, see --fusion), gpu (default auto)")
    p.add_argument("--seed", type=_seed, default=0, help="seed for secrets, keys and random inputs (default 0)")
    p.add_argument("--check", metavar="CHECK.toml",
                   help="check file: inputs and output formulas (default: caramel/checks/<Family>.toml if "
                        "it exists, else random inputs and no judgement)")
    p.add_argument("--no-check", action="store_true", help="random inputs, no decryption check")
    p.add_argument("--gpus", type=_positive, metavar="G",
                   help="devices for a multi-chip program: gpu backend, G GPUs (default one per chip, at most "
                        "those present; fewer GPUs than chips run several chips per GPU); cpu-plan backend, G "
                        "simulated devices in host threads")
    p.add_argument("--streams", type=_positive, metavar="S",
                   help="CUDA streams per GPU (default 4 for a 1-chip graph; multi-GPU: see docs/MULTI_GPU.md); "
                        "cpu-plan devices run in a random order that S streams allow")
    p.add_argument("--distributed", action="store_true",
                   help="process mode: this process is one GPU of a run started by a launcher (RANK, WORLD_SIZE, "
                        "LOCAL_RANK, CARAMEL_RENDEZVOUS; see `caramel launch`)")
    p.add_argument("--cluster", metavar="ADDRESS", help="run on a Dask cluster (pip install -e '.[cluster]' in the "
                   "clone): a scheduler address (tcp://host:8786) or 'local' (one worker process per GPU, or per "
                   "simulated device on the CPU; --gpus picks how many). With --batch B the instances spread over "
                   "every worker; without, a K-chip program runs one chip per worker (docs/CLUSTER.md)")
    p.add_argument("--key-seed", type=_seed, metavar="K", help="seed of the secrets and evaluation keys (default: "
                   "--seed; with --keys, the store's key seed); inputs always come from --seed")
    p.add_argument("--batch", type=_positive, metavar="B",
                   help="run B independent instances (inputs from seed S + i, one set of keys from the key seed) "
                        "over --gpus devices; one line per instance and a summary")
    p.add_argument("--inputs", metavar="FILE", help="encrypt these values (.npz or .json, one vector or scalar per "
                   "input name; (B, N/2) stacked for --batch) instead of random ones")
    p.add_argument("--shared", metavar="INPUTS", help="inputs every instance of a --batch shares (a model's "
                   "constants): comma-separated input names, fnmatch patterns ('cts*,stc*') or the kinds plaintexts, "
                   "scalars, ciphertexts; drawn once from the key seed (or --inputs' unstacked values) and written "
                   "once into each device (a single run with --seed S+i equals instance i of such a batch)")
    _add_output(p, "--save-outputs", "write the decrypted output vectors to FILE.npz", metavar="FILE.npz",
                label="outputs", stdout=False, suffixes=(".npz",))
    p.add_argument("--save-limbs", action="store_true", help="with --save-outputs: also the raw output limbs "
                   "(<name>.c0, <name>.c1, <name>.limbs)")
    p.add_argument("--fusion", choices=FUSIONS, metavar="{" + ",".join(FUSIONS) + "}",
                   help="the plan the cpu-plan and gpu backends replay: on (fused kernels, the fastest replay), off "
                        "(one kernel per instruction: a few generic kernels that every program shares), auto "
                        "(fused when this program's fused plan is cached: after a fused run or `caramel compile`; "
                        "else off). Default: auto for one instance, on with --batch (compiling "
                        "a program's fused kernels takes seconds of every core; one replay does not repay them)")
    _add_json(p, "the results (digest, checks, time per phase, environment)")
    _add_keys(p)

    p = command("keys", "generate the secrets and every evaluation key a program needs into a key store folder",
                cmd_keys)
    key_n(p)
    p.add_argument("--seed", type=_seed, default=0, help="key seed (default 0; `run --seed S` uses key seed S)")
    p.add_argument("--mode", choices=("exact", "textbook", "emulator"), default="exact",
                   help="accepted for symmetry with run; keys do not depend on the mode")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where the key arithmetic runs: auto (a GPU when usable; default), cpu or gpu (the keys "
                        "are the same bit for bit)")
    p.add_argument("--out", metavar="DIR", required=True, help="key store folder: a new or empty folder, or a key "
                   "store that caramel keys wrote (replaced whole); created mode 0700, it holds the secret key")

    from caramel.launch import HEARTBEAT_SECONDS

    p = command("launch", "start G local processes of a caramel command in process mode (one per GPU)", cmd_launch,
                program=False)
    p.description = ("start G local processes of `caramel ARGS --distributed` (RANK, WORLD_SIZE, LOCAL_RANK, "
                     "CARAMEL_RENDEZVOUS set), one per GPU, like torchrun")
    p.add_argument("--nproc", type=_positive, required=True, help="number of processes (GPUs)")
    p.add_argument("--heartbeat-timeout", type=_seconds, default=HEARTBEAT_SECONDS, metavar="S",
                   help=f"end the run when a process shows no heartbeat for S seconds (stopped, frozen; default "
                        f"{HEARTBEAT_SECONDS:g})")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the caramel command, e.g. -- run PROGRAM --backend gpu")

    p = command("plan", "build the execution plan (DAG, fusion, batching) and print what it did", cmd_plan)
    p.add_argument("--n", type=_ring_dimension, default=MAX_N, help=f"ring dimension N for byte figures "
                   f"(default {MAX_N})")
    p.add_argument("--no-fuse", action="store_true", help="one kernel per instruction (the unfused baseline)")
    p.add_argument("--no-ntt-fuse", action="store_true",
                   help="no fusion across NTT boundaries (a lift, mod or base conversion computed in the NTT's load)")
    p.add_argument("--no-aut-fuse", action="store_true",
                   help="no automorphisms computed in the loads of the elementwise kernels that read them")
    p.add_argument("--no-epilogue", action="store_true",
                   help="no NTT epilogues (an elementwise kernel running the second pass of the NTT it reads)")
    p.add_argument("--ntt-loads", metavar="KINDS", help="what NTT loads compute: 'all', 'none' or some of "
                   "sud_lift,mod,baseconv (default: sud_lift,mod; the converting load is slower on the GPU)")
    p.add_argument("--max-outputs", metavar="K", type=_positive,
                   help="elementwise trees of one level and prime that read a common limb share a row of at most K "
                        "outputs, reading it once (default: the planner's, caramel.plan.fusion.MAX_OUTPUTS; 1: none)")
    _add_json(p, "the plan (kernels, rows, buffers)")
    _add_output(p, "--dag-json", "write the whole-program dependency DAG to FILE as networkx node-link JSON "
                "(networkx.node_link_graph(json.load(f), edges='edges') reloads it)", label="dag")
    _add_output(p, "--dot", f"write the dependency DAG as Graphviz DOT to FILE (programs of at most {DOT_MAX_NODES} "
                "instructions)", label="dot")

    p = command("compile", "warm every cache a GPU run needs: the load and plan caches and (on a GPU) every kernel, "
                "compiled in parallel", cmd_compile)
    p.add_argument("--n", type=_ring_dimension, default=65536, help="ring dimension N (default 65536)")
    p.add_argument("--mode", choices=("exact", "textbook", "emulator"), default="exact",
                   help="arithmetic of base conversion and rescale (default exact)")
    p.add_argument("--gpus", type=_positive, metavar="G", help="devices of the run (default one per chip)")

    p = command("profile", "time a program (eager, graph, graph+fusion), per kernel kind, and write a trace",
                cmd_profile)
    key_n(p)
    p.add_argument("--mode", choices=("exact", "textbook", "emulator"), default="exact",
                   help="arithmetic of base conversion and rescale (default exact)")
    p.add_argument("--seed", type=_seed, default=0, help="seed for secrets, keys and random inputs (default 0)")
    p.add_argument("--repeats", type=_positive, default=10, help="timed runs per variant (default 10)")
    p.add_argument("--warmup", type=_count, default=1, help="untimed runs before timing (default 1)")
    p.add_argument("--backend", choices=("auto", "gpu", "cpu-plan"), default="auto",
                   help="gpu (1-chip programs, CUDA events), cpu-plan (NumPy plan engine, wall clock) or auto "
                        "(a GPU when usable; default)")
    _add_output(p, "--trace", "write a Chrome trace (Perfetto) of one instrumented run to FILE")
    p.add_argument("--gpus", type=_gpu_list, metavar="1,2,4,8",
                   help="scaling profile: PROGRAM is a family (path prefix such as programs/Mul_10L, or an archive "
                        "such as BootstrapLike_51L.tar.xz) whose G-chip program runs on G devices for each G")
    _add_output(p, "--plot", "with --gpus: save the scaling curve (PNG, PDF or SVG by the file's extension; needs "
                "matplotlib: pip install -e '.[plot]')", metavar="FILE.png", stdout=False,
                suffixes=(".png", ".pdf", ".svg"))
    p.add_argument("--streams", type=_positive, metavar="S", help="with --gpus: CUDA streams per device "
                   "(default: the multi-GPU executor's)")
    p.add_argument("--predict-only", action="store_true", help="with --gpus: no run on G devices, only the timeline "
                   "model's prediction (docs/MULTI_GPU.md)")
    p.add_argument("--throughput", action="store_true", help="instances per second: served (ciphertexts encrypted "
                   "ahead, plaintexts and scalars shared and resident) and end to end (every input drawn per "
                   "instance), --repeats instances each, and where an instance's time goes; with --gpus: the "
                   "family's 1-chip program on G devices (instances/s, speedup, efficiency)")
    p.add_argument("--shared", metavar="INPUTS", help="with --throughput: the inputs shared when serving (default "
                   "plaintexts,scalars; see `caramel run --shared`)")
    _add_json(p, "the figures (and the environment)")
    _add_keys(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``caramel`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Ctrl-C anywhere in here (argument parsing, loading, a run, printing an error) ends the command with
    one line ``caramel: interrupted`` on stderr and exit code 130, never a traceback. What a command
    started must not outlive it: ``caramel launch`` stops its processes as the interrupt unwinds it,
    and the host threads of a multi-device run are daemons.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return _interrupted()


def console() -> None:
    """The ``caramel`` command as a process (the console script, ``python -m caramel``): :func:`main`,
    then the exit with its code. After a command that loaded CuPy, the process ends at once
    (``os._exit``) once the logging handlers and stdout/stderr are flushed: every file the command
    writes is complete by then (written atomically and closed), and all that the interpreter's own
    teardown would add is CuPy's and CUDA's (memory pools, the context: about 0.2 s after a run on
    the GPU) and the joining of idle pool threads. Any other command exits normally."""
    code = main()
    if "cupy" in sys.modules:
        _leave(code)
    sys.exit(code)


def _leave(code: int) -> None:
    """``os._exit(code)`` after flushing and closing the logging handlers and flushing stdout and
    stderr (a stream that cannot be flushed, such as a closed pipe, is left as it is)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _interrupted() -> int:
    """Report a Ctrl-C; a second one while reporting changes nothing (never a traceback)."""
    import signal

    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, KeyboardInterrupt):  # not the main thread, or the second Ctrl-C came already
        previous = None
    try:
        print("caramel: interrupted", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return EXIT_INTERRUPTED


def _with_stdout_for_results(args: argparse.Namespace) -> int:
    """The command of an output ``-``: its text goes to stderr, so that stdout carries the result
    alone (:func:`_write` writes to ``args.stdout``)."""
    import contextlib

    args.stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return args.func(args)


def _main(argv: Sequence[str] | None) -> int:
    _start_gpu(sys.argv[1:] if argv is None else list(argv))  # before build_parser imports the API
    if "--distributed" in (sys.argv[1:] if argv is None else argv):
        from caramel.launch import start_heartbeat

        start_heartbeat()  # a rank of `caramel launch` beats from its start (the launcher watches it)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    from caramel.logs import configure

    with configure(-1 if getattr(args, "quiet", False) else 1 if getattr(args, "verbose", False) else 0):
        try:
            if _check_outputs(args):  # every output path, before any work
                return _with_stdout_for_results(args)
            return args.func(args)
        except CaramelError as exc:
            print(f"caramel: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except BrokenPipeError:  # the reader went away (e.g. `caramel stats X | head`): stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141
        except OSError as exc:
            print(f"caramel: error: {exc}", file=sys.stderr)
            return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    console()
