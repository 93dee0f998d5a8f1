"""The rendezvous interface (:class:`Rendezvous`), what ranks say when they meet and how it is
compared, and the message format of the file and store ways (:mod:`caramel.execute.rendezvous`)."""

from __future__ import annotations

import abc
import json
import os
import socket
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from caramel.errors import CaramelError, ExecutionError

#: Variables that say an MPI launcher (Open MPI, MPICH/Hydra, PMIx, Slurm's srun) started this process.
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID")
#: Variables that say torchrun (torch.distributed.elastic) started this process.
TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR")


class Disagreement(ExecutionError):
    """The ranks of a run disagree (world size, run, rank numbers, program or options): every
    rank that compared the hellos raises it, so no rank needs telling."""


class PeerFailed(ExecutionError):
    """Another rank of the run failed (``rank``, for ``reason``): this one stops too."""

    def __init__(self, rank: int, reason: str):
        super().__init__(f"rank {rank} failed: {reason}")
        self.rank, self.reason = rank, reason

    def __reduce__(self):  # crosses processes (Dask) with its fields
        return (type(self), (self.rank, self.reason))


@dataclass(frozen=True)
class RunIdentity:
    """What every rank of one run must agree on (compared in :meth:`Rendezvous.meet`)."""

    program: str  # SHA-256 of the program's files (caramel.parse.source_digest)
    n: int
    mode: str
    seed: int
    world: int
    backend: str
    check: str | None = None  # SHA-256 of the check file's text, or None
    key_seed: int | None = None  # the seed of the key material (caramel.ckks.keyset), when not ``seed``
    batch: int | None = None  # instances of a batch, None for one partitioned run
    fused: bool = True  # whether the plan is fused (caramel.options.ranks_fuse)

    def to_json(self) -> dict:
        return dict(vars(self))


def hello(rank: int, world: int, run_id: str | None, identity: RunIdentity | None, token: str | None = None) -> dict:
    """What a rank says when it meets the others: its place, its run and its identity, and who it is."""
    return {"rank": rank, "world": world, "run_id": run_id,
            "identity": None if identity is None else identity.to_json(), "host": socket.gethostname(),
            "pid": os.getpid(), "token": token or uuid.uuid4().hex}


def who(h: Mapping) -> str:
    """A rank's process in words: ``pid 123 on host h``."""
    return f"pid {h.get('pid')} on host {h.get('host')}"


def compare(a: Mapping, b: Mapping) -> str | None:
    """What the hellos of two ranks disagree on (world size, run, program and options), in words
    naming both ranks and their processes; None when they agree. The lower rank is the reference."""
    if b.get("rank", 0) < a.get("rank", 0):
        a, b = b, a
    ra, rb = a.get("rank"), b.get("rank")
    if ra == rb:
        return f"two processes are rank {ra}: {who(a)} and {who(b)}: every process needs its own RANK"
    if a.get("world") != b.get("world"):
        return f"rank {rb} ({who(b)}) has WORLD_SIZE {b.get('world')}, rank {ra} ({who(a)}) has {a.get('world')}"
    if a.get("run_id") != b.get("run_id"):
        return (f"rank {rb} ({who(b)}) is in run {b.get('run_id')!r}, rank {ra} ({who(a)}) in run {a.get('run_id')!r} "
                "(processes of different launches?)")
    mine, theirs = a.get("identity"), b.get("identity")
    if (theirs is None) != (mine is None):
        return f"rank {rb} and rank {ra} run different commands"
    if theirs is not None:
        fields = [f"{k} {v!r} at rank {rb}, {mine.get(k)!r} at rank {ra}" for k, v in theirs.items()
                  if mine.get(k) != v]
        if fields:
            return (f"rank {rb} does not match rank {ra} ({'; '.join(fields)}): every rank must run the same program "
                    "with the same N, mode, seed, check, backend and world size")
    return None


def disagreements(hellos: Sequence[Mapping]) -> str | None:
    """What the ranks' hellos (index r: rank r's) disagree on, in words naming the ranks; None when
    they agree. Rank 0's hello is the reference."""
    for r, h in enumerate(hellos):
        if h.get("rank") != r:
            return f"the process at rank {r} ({who(h)}) says it is rank {h.get('rank')}"
    for h in hellos[1:]:
        problem = compare(hellos[0], h)
        if problem is not None:
            return problem
    return None


class Rendezvous(abc.ABC):
    """One process's end of a run's rendezvous (module docstring). Values sent under a tag are
    received in the order sent between each pair of ranks."""

    rank: int
    world: int
    #: the run this rendezvous belongs to once :meth:`meet` returned (rank 0's when the launcher named none)
    run_id: str | None = None

    @abc.abstractmethod
    def send(self, dest: int, tag: str, value: Any) -> None:
        """Deliver ``value`` to rank ``dest`` under ``tag`` (without waiting for it to be received)."""

    @abc.abstractmethod
    def receive(self, source: int, tag: str, timeout: float) -> Any:
        """The value rank ``source`` sent under ``tag``; an :class:`ExecutionError` naming the rank
        when it failed, ended or went silent, or when ``timeout`` seconds passed."""

    def meet(self, identity: RunIdentity | None, timeout: float) -> None:
        """Every rank's :func:`hello` at every rank, each compared as it arrives (:func:`compare`):
        a :class:`Disagreement` naming what differs. Sets :attr:`run_id` (the launcher's, else one
        made by rank 0)."""
        mine = hello(self.rank, self.world, self.run_id, identity)
        for r in range(self.world):
            if r != self.rank:
                self.send(r, "hello", mine)
        hellos: list = [None] * self.world
        hellos[self.rank] = mine
        for r in range(self.world):
            if r != self.rank:
                hellos[r] = self.receive(r, "hello", timeout)
                problem = compare(mine, hellos[r]) if isinstance(hellos[r], dict) else "a malformed hello"
                if problem is not None:
                    raise Disagreement(f"the ranks disagree: {problem}")
        problem = disagreements(hellos)
        if problem is not None:
            raise Disagreement(f"the ranks disagree: {problem}")
        self.run_id = hellos[0]["run_id"] or hellos[0]["token"]

    def broadcast(self, tag: str, value: Any, timeout: float, root: int = 0) -> Any:
        """``value`` of rank ``root`` at every rank."""
        if self.rank == root:
            for r in range(self.world):
                if r != root:
                    self.send(r, tag, value)
            return value
        return self.receive(root, tag, timeout)

    def gather(self, tag: str, value: Any, timeout: float, root: int = 0) -> list | None:
        """Every rank's ``value`` (index r: rank r's) at ``root``; None elsewhere."""
        if self.rank != root:
            self.send(root, tag, value)
            return None
        return [value if r == root else self.receive(r, tag, timeout) for r in range(self.world)]

    def allgather(self, tag: str, value: Any, timeout: float) -> list:
        """Every rank's ``value`` at every rank."""
        return self.broadcast(f"{tag}.all", self.gather(tag, value, timeout), timeout)

    def fail(self, reason: str, origin: int | None = None) -> None:
        """Tell the other ranks, best effort, that this one failed (they stop waiting on it);
        ``origin``: the rank whose failure this one passes on (``reason`` is then that rank's)."""

    def on_abort(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (from another thread) when another rank fails while this one may be blocked
        outside :meth:`receive`, e.g. in an NCCL collective (only where the way can tell: Dask)."""

    def fabric(self, device: int, timeout: float):
        """The CPU backend's collectives over this rendezvous (device = this rank)."""
        from caramel.execute.fabric.messages import MessageFabric

        return MessageFabric(device, self.send, self.receive, timeout)

    def close(self) -> None:
        """Release what this end holds (threads, files addressed to it, connections)."""

    def __enter__(self) -> "Rendezvous":
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            if isinstance(error, PeerFailed):
                self.fail(error.reason, error.rank)
            elif error is not None and not isinstance(error, KeyboardInterrupt):
                self.fail(str(error) if isinstance(error, CaramelError) else f"{type(error).__name__}: {error}")
        finally:
            self.close()


# ------------------------------------------------------------------------------------------ encoding

_MAGIC = b"CARAMEL-MSG1\n"
_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32",
                     "float64", "complex128"})


def encode(value: Any) -> bytes:
    """``value`` (module docstring) as bytes: a magic line, the length of a JSON header, the header
    (the structure, each array as its dtype, shape and offset) and the arrays' bytes."""
    arrays: list[np.ndarray] = []

    def walk(v):
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.ascontiguousarray(v)
            if a.dtype.name not in _DTYPES:
                raise TypeError(f"cannot send an array of {a.dtype}")
            arrays.append(a)
            return {"a": len(arrays) - 1, "dtype": a.dtype.name, "shape": list(a.shape), "scalar": a.ndim == 0 and
                    isinstance(v, np.generic)}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise TypeError("dict keys must be strings")
            return {"d": [[k, walk(x)] for k, x in v.items()]}
        if isinstance(v, (list, tuple)):
            return {"l": [walk(x) for x in v]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise TypeError(f"cannot send a {type(v).__name__}")

    header = json.dumps(walk(value)).encode()
    return b"".join([_MAGIC, struct.pack("<Q", len(header)), header, *(a.tobytes() for a in arrays)])


def decode(data: bytes, where: str = "message") -> Any:
    """The value of :func:`encode`'s bytes; a :class:`ExecutionError` naming ``where`` when they are
    not such bytes (every declared array must fit in the bytes given: nothing bigger is allocated)."""
    def bad(why: str) -> ExecutionError:
        return ExecutionError(f"{where}: not a caramel message ({why})")

    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 8:
        raise bad("no header")
    (size,) = struct.unpack_from("<Q", data, len(_MAGIC))
    start = len(_MAGIC) + 8
    if size > len(data) - start:
        raise bad("header longer than the file")
    try:
        tree = json.loads(data[start:start + size])
    except (ValueError, RecursionError):
        raise bad("header is not JSON") from None
    body = memoryview(data)[start + size:]
    offset = [0]

    def walk(v, depth=0):
        if depth > 64:
            raise bad("nested too deeply")
        if isinstance(v, dict):
            if "a" in v:
                dtype, shape = v.get("dtype"), v.get("shape")
                if dtype not in _DTYPES or not isinstance(shape, list) or not all(
                        isinstance(s, int) and s >= 0 for s in shape):
                    raise bad("bad array")
                count = int(np.prod(shape, dtype=object))
                nbytes = count * np.dtype(dtype).itemsize
                if nbytes > len(body) - offset[0]:
                    raise bad("array longer than the file")
                a = np.frombuffer(body[offset[0]:offset[0] + nbytes], dtype=dtype).reshape(shape).copy()
                offset[0] += nbytes
                return a[()] if v.get("scalar") else a
            if "d" in v:
                return {str(k): walk(x, depth + 1) for k, x in v["d"]}
            if "l" in v:
                return [walk(x, depth + 1) for x in v["l"]]
            raise bad("unknown node")
        return v

    out = walk(tree)
    if offset[0] != len(body):
        raise bad("trailing bytes")
    return out


__all__ = ["Disagreement", "MPI_ENV", "PeerFailed", "Rendezvous", "RunIdentity", "TORCHRUN_ENV", "compare", "decode",
           "disagreements", "encode", "hello", "who"]
