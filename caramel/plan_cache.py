"""The plan cache: a :class:`~caramel.plan.Plan` kept beside the load cache, stored safely.

Planning a large program (SSA, lowering, fusion, batching) costs about a second per run; the plan
depends only on the program's instructions and the planner's code, so it is kept on disk next to
the load cache (:mod:`caramel.cache`) and read back in a fraction of that.

**What an entry is the cache of.** A plan is cached only for a program that
:func:`caramel.parse.load_program` returned (it records the program's load-cache key, which covers
the program's files and the parser, with :func:`caramel.cache.remember`); any other program (built in memory,
or changed with ``dataclasses.replace``) is planned as before. The entry name is the SHA-256 of
that key, the planner's fingerprint (:func:`planner_fingerprint`: the source of
``caramel/plan/*.py``, ``caramel/program.py``, ``caramel/expr.py``, ``caramel/target.py`` and this module), the build
options (``fuse``, ``max_inputs``, ``fuse_ntt``, ``max_outputs``, ``fuse_automorphism``) and the target the rows are
ordered for (:class:`caramel.target.Target`); the entry's header repeats all of them (and :data:`FORMAT_VERSION`,
the caramel version), and an entry whose header differs is rebuilt, never used.

**Entry format** (one file ``<key>.plan``)::

    b"CARAMEL-PLAN\\0"  (13 bytes, MAGIC)
    SHA-256 of everything after it  (32 bytes)
    an uncompressed .npz: "header" (uint8, UTF-8 JSON) and integer tables

Tuples of ints (a row's inputs, outputs and scalars, a kernel's limbs, lines and dependencies)
are listed once each in a CSR table (``tup_off``/``tup_val``); rows, kernels and collectives are
column tables (``r_*``, ``k_*``, ``c_*``); the distinct expressions, each chip's inputs, stores and
scalar table are JSON in the header. Decoding checks every index against its table: an entry that
is truncated, bit-flipped, of another program or planner, or inconsistent is rebuilt (and
rewritten), never loaded. Nothing in an entry can execute code (``allow_pickle=False``, JSON).

**Trust** is that of the load cache (:func:`caramel.cache.trusted_folder`,
:func:`~caramel.cache.read_entry`, :func:`~caramel.cache.write_entry`): a folder of mode 0700
owned by the user, entries opened without following symlinks, written atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from caramel import cache as store
from caramel.cache import program_key, remember
from caramel.infiles import read_package_file
from caramel.parse import no_gc
from caramel.program import Mem, Program
from caramel.plan.fusion import MAX_INPUTS, MAX_OUTPUTS
from caramel.target import NEUTRAL, Target

if TYPE_CHECKING:
    from caramel.plan.kernel import Plan

logger = logging.getLogger(__name__)

FORMAT_VERSION = 4  # 2: kernels carry an NTT prologue (k_pro_kind, k_pro_width, k_pro_in); 3: gathered operands
# (an expression's ``gathered``, a row's ``gather`` as r_gather: (has step, step) pairs); 4: NTT epilogues (an
# expression's ``transformed``, a kernel's ``half`` as k_half)
MAGIC = b"CARAMEL-PLAN\0"
SUFFIX = ".plan"


class PlanEntryError(store.CacheEntryError):
    """An entry that must not be used (internal: the caller rebuilds it)."""


@lru_cache(maxsize=1)
def planner_fingerprint() -> str:
    """SHA-256 of the planner's source: ``caramel/plan/*.py``, ``caramel/program.py``, ``caramel/expr.py``,
    ``caramel/target.py``, this module."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in [*sorted((root / "plan").glob("*.py")), root / "program.py", root / "expr.py", root / "target.py",
              Path(__file__).resolve()]:
        h.update(p.name.encode() + b"\0" + hashlib.sha256(read_package_file(p)).digest())
    return h.hexdigest()


def _meta(key: str, fuse: bool, max_inputs: int, fuse_ntt=True, max_outputs: int = MAX_OUTPUTS,
          fuse_automorphism: bool = True, target: Target = NEUTRAL) -> dict:
    from caramel.plan.fusion import ntt_load_kinds
    from caramel.version import __version__

    return {"format": FORMAT_VERSION, "caramel": __version__, "program": key, "planner": planner_fingerprint(),
            "fuse": bool(fuse), "max_inputs": int(max_inputs), "fuse_ntt": sorted(k.value for k in ntt_load_kinds(fuse_ntt)),
            "max_outputs": int(max_outputs), "fuse_automorphism": bool(fuse_automorphism), "target": target.key()}


def entry_path(folder: Path, meta: dict) -> Path:
    return folder / (hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest() + SUFFIX)


# ---------------------------------------------------------------------------------------------- encode


def _mem(m: Mem | None):
    return None if m is None else [m.term, m.limb]


def _gather_pairs(gather: tuple) -> tuple[int, ...]:
    """A row's ``gather`` as (has step, step) pairs, flat: None -> (0, 0), a step -> (1, step)."""
    if any(a is not None and type(a) is not int for a in gather):
        raise TypeError(f"gathered operand argument {gather!r}")
    return tuple(x for a in gather for x in ((0, 0) if a is None else (1, a)))


_INT_OR_NONE = frozenset({int, type(None)})


def encode(plan, meta: dict) -> dict[str, np.ndarray]:
    """``plan`` as integer tables plus a JSON ``header`` (``meta`` merged in). Raises TypeError for
    a plan with a field of an unexpected type (it is then not cached)."""
    from caramel.plan.kernel import Kind

    kinds = {k: i for i, k in enumerate(Kind)}
    tuples = store.numbering()  # every distinct int tuple -> its row of the CSR table, in the order first seen
    number = tuples.__getitem__
    exprs: dict = {}
    r_cols: dict[str, list] = {c: [] for c in ("prime", "ins", "outs", "scalars", "arg", "has_arg", "gather")}
    k_cols: dict[str, list] = {c: [] for c in ("kind", "rows", "expr", "in", "out", "comms", "level", "lines", "deps",
                                               "pro_kind", "pro_width", "pro_in", "half")}
    c_cols: dict[str, list] = {c: [] for c in ("op", "sync", "size", "src", "dst", "prime")}
    chips = []
    for chip in plan.chips:
        for k, deps in zip(chip.kernels, chip.deps, strict=True):
            k_cols["kind"].append(kinds[k.kind])
            k_cols["rows"].append(len(k.rows))
            if k.rows:  # column by column; tuples numbered row by row (inputs, outputs, scalars, gather)
                prime, ins, outs, scalars, arg, gather = zip(*k.rows)
                if not set(map(type, arg)) <= _INT_OR_NONE:
                    raise TypeError(f"row argument {next(a for a in arg if type(a) not in _INT_OR_NONE)!r}")
                if any(gather):
                    gather = tuple(map(_gather_pairs, gather))
                numbers = list(map(number, chain.from_iterable(zip(ins, outs, scalars, gather))))
                r_cols["prime"] += prime
                r_cols["ins"] += numbers[0::4]
                r_cols["outs"] += numbers[1::4]
                r_cols["scalars"] += numbers[2::4]
                r_cols["gather"] += numbers[3::4]
                r_cols["arg"] += [0 if a is None else a for a in arg]
                r_cols["has_arg"] += [a is not None for a in arg]
            if k.expr is None:
                k_cols["expr"].append(-1)
            else:
                e = k.expr
                text = (e.n_vec, e.n_scalar, tuple((o.op, tuple(o.args)) for o in e.ops), tuple(e.outputs),
                        tuple(e.gathered), tuple(e.transformed))
                k_cols["expr"].append(exprs.setdefault(text, len(exprs)))
            k_cols["in"].append(number(k.in_limbs))
            k_cols["out"].append(number(k.out_limbs))
            k_cols["comms"].append(len(k.comms))
            for c in k.comms:
                c_cols["op"].append(store._OPCODE_INDEX[c.op])
                for f in ("sync", "size", "src", "dst", "prime"):
                    c_cols[f].append(getattr(c, f))
            k_cols["level"].append(k.level)
            k_cols["lines"].append(number(k.lines))
            k_cols["deps"].append(number(tuple(deps)))
            pro = k.prologue
            k_cols["pro_kind"].append(-1 if pro is None else kinds[pro.kind])
            k_cols["pro_width"].append(0 if pro is None else pro.width)
            k_cols["pro_in"].append(number(() if pro is None else tuple(pro.in_limbs)))
            k_cols["half"].append(int(k.half))
        chips.append({
            "chip": chip.chip, "kernels": len(chip.kernels), "n_buffers": chip.n_buffers,
            "zero_buffer": chip.zero_buffer, "instructions": chip.instructions,
            "inputs": [[m.term, m.limb, b] for m, b in chip.inputs.items()],
            "stores": [[m.term, m.limb, b] for m, b in chip.stores.items()],
            "scalars": [[_mem(s.mem), list(s.limbs), s.prime] for s in chip.scalars],
        })
    rows = list(tuples)
    if not set(map(type, chain.from_iterable(rows))) <= {int}:  # (one check of every element)
        raise TypeError(f"not a tuple of ints: {next(t for t in rows if any(type(x) is not int for x in t))!r}")
    header = {**meta, "chips": chips, "exprs": [[n, s, [[o, list(a)] for o, a in ops], list(out), list(g), list(t)]
                                                 for n, s, ops, out, g, t in exprs]}
    arrays = {f"r_{c}": np.asarray(v, dtype=np.int64) for c, v in r_cols.items()}
    arrays.update({f"k_{c}": np.asarray(v, dtype=np.int64) for c, v in k_cols.items()})
    arrays.update({f"c_{c}": np.asarray(v, dtype=np.int64) for c, v in c_cols.items()})
    arrays["tup_off"], arrays["tup_val"] = store._csr(rows)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    return arrays


# ---------------------------------------------------------------------------------------------- decode


def _ids(a: np.ndarray, n: int, what: str, none: bool = False) -> list[int]:
    """``a`` as a list of indices into a table of ``n`` entries (-1 too when ``none``)."""
    if a.size and (int(a.min()) < (-1 if none else 0) or int(a.max()) >= n):
        raise PlanEntryError(f"{what} index out of range")
    return a.tolist()


def decode(arrays, header: dict, name: str):
    """The :class:`~caramel.plan.Plan` of :func:`encode`'s tables, named ``name``."""
    from caramel.plan.kernel import ChipPlan, Comm, Expr, ExprOp, Kernel, Kind, Plan, Prologue, Row, ScalarSpec

    off = arrays["tup_off"].tolist()
    val = tuple(arrays["tup_val"].tolist())  # (a tuple's slices are tuples)
    if not off or off[0] != 0 or off[-1] != len(val) or (np.diff(arrays["tup_off"]) < 0).any():
        raise PlanEntryError("tuple table inconsistent")
    tuples = [val[a:b] for a, b in zip(off, off[1:])]
    nt = len(tuples)
    try:  # (an Expr checks itself)
        exprs = [Expr(int(n), int(s), tuple(ExprOp(str(o), tuple(int(x) for x in a)) for o, a in ops),
                      tuple(int(x) for x in out), tuple(int(x) for x in g), tuple(int(x) for x in t))
                 for n, s, ops, out, g, t in header["exprs"]]
    except ValueError as exc:
        raise PlanEntryError(f"expression inconsistent: {exc}") from None
    r = {c: arrays[f"r_{c}"] for c in ("prime", "ins", "outs", "scalars", "arg", "has_arg", "gather")}
    k = {c: arrays[f"k_{c}"] for c in ("kind", "rows", "expr", "in", "out", "comms", "level", "lines", "deps",
                                       "pro_kind", "pro_width", "pro_in", "half")}
    c = {f: arrays[f"c_{f}"] for f in ("op", "sync", "size", "src", "dst", "prime")}
    if len({len(v) for v in r.values()}) > 1 or len({len(v) for v in k.values()}) > 1 or len({len(v) for v in c.values()}) > 1:
        raise PlanEntryError("columns of different lengths")
    if int(k["rows"].sum()) != len(r["prime"]) or int(k["comms"].sum()) != len(c["op"]) or (k["rows"] < 0).any() \
            or (k["comms"] < 0).any() or sum(ch["kernels"] for ch in header["chips"]) != len(k["kind"]):
        raise PlanEntryError("row, collective or kernel counts do not add up")
    ins, outs, sca = (map(tuples.__getitem__, _ids(r[f], nt, "row tuple")) for f in ("ins", "outs", "scalars"))
    args = [a if h else None for a, h in zip(r["arg"].tolist(), r["has_arg"].tolist())]
    gather_ids = _ids(r["gather"], nt, "row tuple")
    gather_of = {i: tuple(a if h else None for h, a in zip(tuples[i][::2], tuples[i][1::2])) for i in set(gather_ids)}
    gathers = list(map(gather_of.__getitem__, gather_ids))  # (each distinct one decoded once)
    rows = list(map(tuple.__new__, [Row] * len(args), zip(r["prime"].tolist(), ins, outs, sca, args, gathers)))
    ops = [store._OPCODES[i] for i in _ids(c["op"], len(store._OPCODES), "opcode")]
    comms = [Comm(op, *f) for op, *f in zip(ops, *(c[x].tolist() for x in ("sync", "size", "src", "dst", "prime")))]
    kinds = list(Kind)
    kind = [kinds[i] for i in _ids(k["kind"], len(kinds), "kernel kind")]
    expr = [None if i < 0 else exprs[i] for i in _ids(k["expr"], len(exprs), "expression", none=True)]
    lim_in, lim_out, lines, deps = ([tuples[i] for i in _ids(k[f], nt, "kernel tuple")] for f in ("in", "out", "lines", "deps"))
    n_rows, n_comms, levels = k["rows"].tolist(), k["comms"].tolist(), k["level"].tolist()
    pro_in = [tuples[i] for i in _ids(k["pro_in"], nt, "kernel tuple")]
    pros = [None if i < 0 else Prologue(kinds[i], int(w), li) for i, w, li in
            zip(_ids(k["pro_kind"], len(kinds), "prologue kind", none=True), k["pro_width"].tolist(), pro_in)]
    halves = k["half"].tolist()
    widths = [len(e.gathered) if e is not None else 0 for e in expr]  # each row's gather: its kernel's width
    if (np.diff(arrays["tup_off"])[r["gather"]] // 2 != np.repeat(widths, k["rows"])).any():
        raise PlanEntryError("gathered operands inconsistent")
    kernels, at_r, at_c = [], 0, 0
    for i in range(len(kind)):
        if halves[i] not in (0, 1) or (halves[i] and kind[i] is not Kind.NTT):
            raise PlanEntryError("half NTT inconsistent")
        pro = pros[i]
        if pro is not None and (kind[i] is not Kind.NTT or pro.kind not in (Kind.SUD_LIFT, Kind.MOD, Kind.BASECONV)
                                or any(len(rw.ins) != pro.width for rw in rows[at_r:at_r + n_rows[i]])):
            raise PlanEntryError("NTT prologue inconsistent")
        kernels.append(Kernel(kind[i], tuple(rows[at_r:at_r + n_rows[i]]), expr[i], lim_in[i], lim_out[i],
                              tuple(comms[at_c:at_c + n_comms[i]]), levels[i], lines[i], pros[i], bool(halves[i])))
        at_r += n_rows[i]
        at_c += n_comms[i]
    chips, at = [], 0
    for ch in header["chips"]:
        n = ch["kernels"]
        chips.append(ChipPlan(
            int(ch["chip"]), tuple(kernels[at:at + n]), tuple(deps[at:at + n]), int(ch["n_buffers"]),
            {Mem(str(t), int(l)): int(b) for t, l, b in ch["inputs"]}, int(ch["zero_buffer"]),
            tuple(ScalarSpec(None if m is None else Mem(str(m[0]), int(m[1])), tuple(int(x) for x in limbs), int(p))
                  for m, limbs, p in ch["scalars"]),
            {Mem(str(t), int(l)): int(b) for t, l, b in ch["stores"]}, int(ch["instructions"])))
        at += n
    return Plan(name, tuple(chips))


def to_bytes(plan, meta: dict) -> bytes:
    """A plan entry's bytes (:func:`caramel.cache.seal` with :data:`MAGIC`)."""
    return store.seal(MAGIC, encode(plan, meta))


def from_bytes(data: bytes, meta: dict, name: str):
    """The plan of an entry, named ``name`` (:func:`caramel.cache.unseal`; :class:`PlanEntryError`
    when it must not be used)."""
    return store.unseal(data, meta, MAGIC, lambda arrays, header: decode(arrays, header, name), PlanEntryError)


# ---------------------------------------------------------------------------------------------- use


def cached_plan(program: Program, *, fuse: bool = True, max_inputs: int = MAX_INPUTS, cache: bool = True,
                fuse_ntt=True, max_outputs: int = MAX_OUTPUTS, fuse_automorphism: bool = True,
                target: Target = NEUTRAL, built: Callable[[Plan], None] | None = None,
                fused: Callable[[frozenset], None] | None = None):
    """``build_plan(program, fuse=fuse, max_inputs=max_inputs, fuse_ntt=fuse_ntt, max_outputs=max_outputs,
    fuse_automorphism=fuse_automorphism, target=target)``, read from the plan cache when
    ``program`` came from :func:`caramel.parse.load_program` and an entry for it (and this planner)
    is there, else built and (for such a program, in a trusted folder) written there. The plan's
    ``timings`` then has one phase, ``cache``. ``built`` is called with the plan as soon as it exists, before its
    entry is written (a first run queues its kernels' compiles there); ``fused``, only when it is built, is
    :func:`~caramel.plan.build_plan`'s (its elementwise programs, sooner)."""
    from caramel.plan import build_plan

    key = program_key(program) if cache else None
    folder = store.cache_dir()
    usable = key is not None and store.trusted_folder(folder, create=True)
    meta = _meta(key, fuse, max_inputs, fuse_ntt, max_outputs, fuse_automorphism, target) if key else None
    path = entry_path(folder, meta) if key else None
    plan = _read_plan(path, meta, program.name, target) if usable else None
    write = plan is None and usable
    if plan is None:
        plan = build_plan(program, fuse=fuse, max_inputs=max_inputs, fuse_ntt=fuse_ntt, max_outputs=max_outputs,
                          fuse_automorphism=fuse_automorphism, target=target, fused=fused)
    if built is not None:
        built(plan)
    if write:
        try:
            with no_gc():
                data = to_bytes(plan, meta)
        except TypeError as exc:  # a field this format does not hold: the plan is not cached
            logger.info("plan of %s not cached: %s", program.name, exc)
        else:
            store.write_entry(path, data)  # a read-only cache is not an error
    return plan


def plan_cached(program: Program, *, target: Target = NEUTRAL, fuse: bool = True) -> bool:
    """Whether the plan cache holds an entry that :func:`cached_plan` with these options (the others at their
    defaults) would read for ``program``: a regular file at its path in a trusted cache folder. Its contents are
    not read: an entry that fails when read is rebuilt as if absent."""
    key = program_key(program)
    folder = store.cache_dir()
    if key is None or not store.trusted_folder(folder, create=False):
        return False
    path = entry_path(folder, _meta(key, fuse, MAX_INPUTS, target=target))
    return path.is_file() and not path.is_symlink()


def _read_plan(path: Path, meta: dict, name: str, target: Target):
    """The plan of the cache entry ``path``, or None (no entry, or one to rebuild)."""
    data = store.read_entry(path)
    if data is None:
        return None
    t0 = time.perf_counter()
    try:
        with no_gc():
            plan = dataclasses.replace(from_bytes(data, meta, name), target=target)
    except PlanEntryError as exc:
        logger.info("rebuilding plan cache entry %s: %s", path, exc)
        return None
    plan.timings["cache"] = time.perf_counter() - t0
    return plan


# ---------------------------------------------------------------------------------------------- schedules

#: Magic and suffix of a stream-schedule entry (:func:`cached_schedule`).
SCHEDULE_MAGIC = b"CARAMEL-SCHED\0"
SCHEDULE_SUFFIX = ".sched"


def tasks_digest(tasks, n_streams: int, reserved: int) -> str:
    """SHA-256 of what a stream schedule is a function of: every task's sorted ``reads`` and
    ``writes``, ``deps``, ``cost`` and ``stream`` (not its name), the stream counts, the planner's
    fingerprint (which covers :mod:`caramel.plan.streams`), the format and caramel's version."""
    from caramel.version import __version__

    h = hashlib.sha256(json.dumps(["schedule", FORMAT_VERSION, __version__, planner_fingerprint(),
                                   int(n_streams), int(reserved), len(tasks)]).encode())
    for t in tasks:
        h.update(np.array([len(t.reads), len(t.writes), len(t.deps), int(t.cost),
                           -1 if t.stream is None else int(t.stream)], dtype=np.int64).tobytes())
        h.update(np.array(sorted(t.reads) + sorted(t.writes) + list(t.deps), dtype=np.int64).tobytes())
    return h.hexdigest()


def _schedule_arrays(sch, digest: str) -> dict[str, np.ndarray]:
    off = np.zeros(len(sch.waits) + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(w) for w in sch.waits])
    header = {"tasks": digest, "n_streams": sch.n_streams, "n_events": sch.n_events}
    return {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
            "stream": np.asarray(sch.stream, dtype=np.int64), "event": np.asarray(sch.event, dtype=np.int64),
            "joins": np.asarray(sch.joins, dtype=np.int64), "wait_off": off,
            "wait_val": np.asarray([j for w in sch.waits for j in w], dtype=np.int64)}


def _schedule_of(arrays, header: dict, n_tasks: int):
    """The :class:`~caramel.plan.streams.StreamSchedule` of an entry's tables, every index checked."""
    from caramel.plan.streams import StreamSchedule

    stream, event, joins = (arrays[k].astype(np.int64).tolist() for k in ("stream", "event", "joins"))
    off, val = arrays["wait_off"].astype(np.int64), arrays["wait_val"].astype(np.int64).tolist()
    m, n_events = int(header["n_streams"]), int(header["n_events"])
    if len(stream) != n_tasks or len(event) != n_tasks or off.shape != (n_tasks + 1,) or int(off[-1]) != len(val):
        raise PlanEntryError("schedule tables of the wrong length")
    if n_tasks and (min(stream) < 0 or max(stream) >= m or max(event) >= n_events or min(event) < -1):
        raise PlanEntryError("stream or event index out of range")
    if np.any(np.diff(off) < 0) or any(not 0 <= j < n_tasks for j in val + joins):
        raise PlanEntryError("task index out of range")
    waits = tuple(tuple(val[a:b]) for a, b in zip(off.tolist(), off[1:].tolist()))
    return StreamSchedule(m, tuple(stream), waits, tuple(joins), tuple(event), n_events)


def cached_schedule(tasks, n_streams: int, reserved: int, build, *, cache: bool = True):
    """``build()`` (a stream schedule of ``tasks`` that it has checked, :mod:`caramel.plan.streams`),
    or the schedule that an earlier ``build()`` gave for the same tasks and stream counts, read from
    the plan cache folder (entry ``<tasks_digest>.sched``, the plan cache's format and trust: a
    sealed npz of integer tables, the digest in its header; a damaged or inconsistent entry is
    rebuilt). The schedule is a function of the tasks (:func:`tasks_digest`), so an entry needs no
    second check."""
    if not cache:
        return build()
    digest = tasks_digest(tasks, n_streams, reserved)
    folder = store.cache_dir()
    usable = store.trusted_folder(folder, create=True)
    path = folder / f"{digest}{SCHEDULE_SUFFIX}"
    data = store.read_entry(path) if usable else None
    if data is not None:
        try:
            return store.unseal(data, {"tasks": digest, "n_streams": int(n_streams)}, SCHEDULE_MAGIC,
                                lambda arrays, header: _schedule_of(arrays, header, len(tasks)), PlanEntryError)
        except PlanEntryError as exc:
            logger.info("rebuilding schedule cache entry %s: %s", path, exc)
    sch = build()
    if usable:
        store.write_entry(path, store.seal(SCHEDULE_MAGIC, _schedule_arrays(sch, digest)))
    return sch


__all__ = ["FORMAT_VERSION", "MAGIC", "SUFFIX", "cached_plan", "cached_schedule", "decode", "encode", "from_bytes",
           "plan_cached", "planner_fingerprint", "program_key", "remember", "tasks_digest", "to_bytes"]
