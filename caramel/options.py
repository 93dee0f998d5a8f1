"""One value for how a program runs: :class:`RunOptions`, validated in one place.

The drivers (:func:`caramel.run_program`, :func:`caramel.run_batch`, :class:`caramel.Executor`,
:func:`caramel.profile.profile_program`, :func:`caramel.scaling.profile_scaling`) take a
``RunOptions`` (or its fields as keywords, which build one)::

    >>> from caramel.options import RunOptions
    >>> opts = RunOptions(n=4096, backend="cpu-plan", seed=3)
    >>> opts.with_(seed=4).seed
    4

Every field is checked when the value is made (:meth:`RunOptions.__post_init__`): a bad field is an
:class:`~caramel.errors.ArgumentError` naming it. What depends on the program (a device count beyond
its chips, the backend actually present) is checked by :func:`check_devices` and :func:`resolve_backend`.
This module imports nothing heavy: no NumPy, no CuPy.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caramel.errors import ArgumentError, CaramelError
from caramel.ring.modes import Mode

#: Names accepted by ``backend``: ``cpu`` (the reference interpreter, instruction by instruction),
#: ``cpu-plan`` (the fused, batched plan on NumPy: bit-identical, fewer passes), ``gpu`` (the plan
#: on CUDA GPUs through CuPy), ``auto`` (``gpu`` when one is usable, else ``cpu``).
BACKENDS = ("auto", "cpu", "cpu-plan", "gpu")
#: Where the client arithmetic (keys, encoding, encryption, decryption) runs: ``auto`` (None): the GPU
#: when the backend is the GPU, else the host.
CLIENTS = ("auto", "cpu", "gpu")
#: Values of ``fusion``: ``on`` (the fused plan: fewer, larger kernels, the fastest replay), ``off`` (one kernel per
#: instruction: a handful of generic kernels that every program shares), ``auto`` (the fused plan when it is in the
#: plan cache, whose kernels a fused run or ``caramel compile`` made; else ``off``). Compiling a program's fused
#: kernels takes seconds of every core, and they save milliseconds a replay: a single run of a program never fused
#: does not repay them (``caramel run``'s default without ``--batch``).
FUSIONS = ("on", "off", "auto")
#: Words of ``shared`` that name every input of a kind (:func:`shared_names`).
SHARED_KINDS = {"ciphertexts": "ciphertext", "plaintexts": "plaintext", "scalars": "scalar"}
#: Largest ring degree the kernels support.
MAX_N = 65536


def _integer(value: Any) -> bool:
    """An integer (NumPy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class RunOptions:
    """How a program runs. ``n``: ring degree; ``mode``: arithmetic of base conversion and rescale
    (:class:`~caramel.ring.Mode` or its name); ``backend``: one of :data:`BACKENDS`; ``seed``: the inputs'
    seed (instance i of a batch uses ``seed + i``); ``key_seed``: the secrets' and evaluation keys' seed
    (default ``seed``); ``check``: ``"auto"`` (``caramel/checks/<Family>.toml`` when it exists), a check
    file's path, a :class:`~caramel.ckks.check.CheckSpec`, or None (random inputs at scale 2^28, not
    judged); ``gpus``: how many devices (``gpu``: GPUs; ``cpu-plan``: simulated devices in host threads;
    default: the executor's); ``device_ids``: the CUDA devices to use instead of 0, 1, ...; ``streams``:
    CUDA streams per GPU; ``client``: where the client arithmetic runs (:data:`CLIENTS`); ``kernels``: the
    CUDA kernels' configuration (``caramel.backends.cuda.config.KernelConfig``), passed through to the
    GPU executors; ``shared``: the inputs every instance shares (input names, ``fnmatch`` patterns, or
    the words ``ciphertexts``, ``plaintexts``, ``scalars``; a comma-separated string is split), written
    once into a resident device; ``depth``: instances in flight per device (GPU lanes; default 3);
    ``workers``: host threads preparing (encoding, encrypting) instances (default by the client); ``fusion``: which
    plan the backends that run one replay (``cpu-plan``, ``gpu``) take, one of :data:`FUSIONS` (default ``on``)."""

    n: int = 65536
    mode: Mode = Mode.EXACT
    backend: str = "auto"
    seed: int = 0
    key_seed: int | None = None
    check: Any = "auto"
    gpus: int | None = None
    device_ids: tuple[int, ...] | None = None
    streams: int | None = None
    client: str | None = None
    kernels: object | None = None
    shared: tuple[str, ...] = ()
    depth: int | None = None
    workers: int | None = None
    fusion: str = "on"

    def __post_init__(self) -> None:
        problems = []
        if not _integer(self.n) or self.n < 16 or self.n & (self.n - 1) or self.n > MAX_N:
            problems.append(f"n must be a power of two from 16 to {MAX_N}, got {self.n!r}")
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            problems.append(f"mode must be one of {', '.join(m.value for m in Mode)}, got {self.mode!r}")
        if self.backend not in BACKENDS:
            problems.append(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("seed", "key_seed"):
            value = getattr(self, name)
            if value is None and name == "key_seed":
                continue
            if not _integer(value) or value < 0:
                problems.append(f"{name} must be an integer >= 0, got {value!r}")
            else:
                object.__setattr__(self, name, int(value))
        for name in ("gpus", "streams", "depth", "workers"):
            value = getattr(self, name)
            if value is not None and (not _integer(value) or value < 1):
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.device_ids is not None:
            ids = self.device_ids
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                problems.append(f"device_ids must be a list of CUDA device ordinals, got {ids!r}")
            else:
                ids = tuple(ids)
                if not ids or any(not _integer(i) or i < 0 for i in ids) or len(set(ids)) != len(ids):
                    problems.append(f"device_ids must be distinct integers >= 0, got {list(ids)!r}")
                else:
                    object.__setattr__(self, "device_ids", tuple(int(i) for i in ids))
                    if self.gpus is not None and _integer(self.gpus) and self.gpus > len(ids):
                        problems.append(f"gpus = {self.gpus} but only {len(ids)} device_ids given {list(ids)}")
        if self.fusion not in FUSIONS:
            problems.append(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if self.client is not None and self.client not in CLIENTS:
            problems.append(f"client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if self.check is not None and not isinstance(self.check, (str, Path)) and \
                type(self.check).__name__ != "CheckSpec":
            problems.append(f"check must be 'auto', a check file's path, a CheckSpec or None, got "
                            f"{type(self.check).__name__}")
        shared = self.shared
        if isinstance(shared, str):
            shared = tuple(s.strip() for s in shared.split(",")) if shared.strip() else ()
        if shared is None:
            shared = ()
        if not isinstance(shared, (tuple, list)) or any(not isinstance(s, str) or not s.strip() for s in shared):
            problems.append(f"shared must be input names, patterns or kinds ({', '.join(SHARED_KINDS)}), got "
                            f"{self.shared!r}")
        else:
            object.__setattr__(self, "shared", tuple(s.strip() for s in shared))
        if problems:
            raise ArgumentError("; ".join(problems))

    @classmethod
    def of(cls, options: "RunOptions | None" = None, **fields) -> "RunOptions":
        """``options`` (default: the defaults) with ``fields`` replaced; an unknown field is an
        :class:`ArgumentError` naming the known ones."""
        if options is not None and not isinstance(options, RunOptions):
            raise ArgumentError(f"options must be a RunOptions, got {type(options).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ArgumentError(f"unknown option(s) {', '.join(unknown)} (RunOptions fields: "
                                f"{', '.join(sorted(known))})")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **fields) if fields else base

    def with_(self, **fields) -> "RunOptions":
        """A copy with ``fields`` replaced (checked again)."""
        return RunOptions.of(self, **fields)

    @property
    def keys_seed(self) -> int:
        """The seed of the secrets and evaluation keys: ``key_seed``, else ``seed``."""
        return self.seed if self.key_seed is None else self.key_seed


def ranks_fuse(fusion: str | None) -> bool:
    """Whether the ranks of one partitioned run (process mode, a cluster's workers) replay the fused plan under
    ``fusion``: ``auto`` (or None, unset) is ``on`` there, since the ranks must agree on one plan and their plan
    caches need not."""
    return fusion != "off"


def key_seed_for(seed: int, key_seed: int | None) -> int:
    """The seed of a run's secrets and evaluation keys: ``key_seed`` when given, else the run's
    ``seed`` (``caramel run --seed S`` uses key seed S; its inputs always come from S)."""
    return seed if key_seed is None else key_seed


def gpu_available() -> bool:
    """Whether CuPy imports and sees a CUDA device."""
    try:
        from caramel.backends.cuda import available
    except ImportError:
        return False
    return available()


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``gpu`` when one is usable, else ``cpu``; unknown names are errors."""
    if backend not in BACKENDS:
        raise CaramelError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend == "auto":
        return "gpu" if gpu_available() else "cpu"
    return backend


def check_devices(program, backend: str, gpus: int | None) -> None:
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


def devices_used(program, backend: str, gpus: int | None) -> int:
    """How many devices a run of ``program`` on ``backend`` (resolved) uses: ``gpus`` when given,
    else 1 on ``cpu``/``cpu-plan`` and on ``gpu`` one per chip, at most the GPUs present."""
    if gpus is not None:
        return gpus
    if backend != "gpu" or program.chips == 1:
        return 1
    import cupy as cp

    return min(program.chips, cp.cuda.runtime.getDeviceCount())


def shared_names(items, kinds) -> tuple[str, ...]:
    """The input names that ``items`` (:attr:`RunOptions.shared`) select among ``kinds`` (input name ->
    kind name: ``ciphertext``, ``plaintext``, ``scalar``), in ``kinds``' order. An item is a kind word of
    :data:`SHARED_KINDS` (every input of that kind, maybe none), an input name, or an ``fnmatch``
    pattern; a name or pattern that selects no input is an :class:`ArgumentError`."""
    from fnmatch import fnmatchcase

    chosen: set[str] = set()
    for item in items:
        if item in SHARED_KINDS:
            chosen |= {n for n, k in kinds.items() if str(k) == SHARED_KINDS[item]}
            continue
        hit = {n for n in kinds if fnmatchcase(n, item)}
        if not hit:
            raise ArgumentError(f"shared: {item!r} names no input (inputs: {', '.join(kinds) or 'none'}; kinds: "
                                f"{', '.join(SHARED_KINDS)})")
        chosen |= hit
    return tuple(n for n in kinds if n in chosen)


__all__ = ["BACKENDS", "CLIENTS", "RunOptions", "SHARED_KINDS", "check_devices", "devices_used", "gpu_available",
           "key_seed_for", "resolve_backend", "shared_names"]
