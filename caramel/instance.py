"""One instance of a program: its check spec, its inputs drawn and encrypted, its output digest.

:func:`prepare_inputs` is the input image of one whole run (every input drawn from one seed, keys
bound). The executor (:mod:`caramel.executor`) prepares instances by parts instead: an
:class:`InputPlan` (built once: each input's scale and limbs) and :func:`draw_inputs`, which draws,
encodes and encrypts only the inputs it is asked for, consuming the instance's random generator
exactly as :func:`~caramel.ckks.check.prepare_check` does when the other inputs are supplied (a
supplied value draws nothing). So an instance with no shared inputs has the image of
``prepare_inputs(seed)``, bit for bit, and an instance whose shared inputs are given has the image
that ``prepare_inputs(seed, supplied=those values)`` would have.

:func:`output_digest` is SHA-256 over the output limbs: equal digests mean bit-identical outputs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from caramel import cores
from caramel.ckks.bind import InputKind, Requirements, requirements
from caramel.ckks.check import (
    CheckError,
    CheckSpec,
    DecodedInputs,
    InputSpec,
    OutputSpec,
    PreparedCheck,
    check_path,
    default_limb_count,
    fit_problems,
    load_check,
    prepare_check,
)
from caramel.ckks.device import host_array
from caramel.ckks.keyset import KeySet, input_rng
from caramel.errors import BindingError
from caramel.program import Mem, Program
from caramel.ring import Context


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
                h.update(np.ascontiguousarray(host_array(memory[key]), dtype=np.uint32))  # its bytes, not copied
    return h.hexdigest()


def resolve_check(program: Program, check: str | Path | CheckSpec | None) -> CheckSpec | None:
    """The check of a run: ``"auto"`` is ``programs/checks/<Family>.toml`` when it exists (else
    none), a path is loaded, a :class:`CheckSpec` or None is used as is."""
    if check == "auto":
        path = check_path(program.name)
        return load_check(path) if path.exists() else None
    if check is None or isinstance(check, CheckSpec):
        return check
    return load_check(check)


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


def load_keyset(directory: str | Path, program: Program, ctx: Context) -> KeySet:
    """The key store ``directory`` (:mod:`caramel.ckks.keystore`) for ``program`` at ``ctx``: raises
    :class:`~caramel.ckks.keystore.KeyStoreError` when it is no key store, was made for another N or
    other primes, is damaged, or lacks a key the program needs."""
    from caramel.ckks.keystore import load_keys, require_keys

    keyset = load_keys(directory, ctx)
    require_keys(keyset, requirements(program).keys, directory)
    return keyset


# ------------------------------------------------------------------------------------------ by parts

#: The class of the object that feeds each input kind.
_OBJECT = {InputKind.CIPHERTEXT: "Ciphertext", InputKind.PLAINTEXT: "Plaintext", InputKind.SCALAR: "Scalar"}


@dataclass(frozen=True)
class InputPlan:
    """How a program's inputs are made at ``ctx`` under ``spec`` (computed once, as
    :func:`~caramel.ckks.check.prepare_check` computes it per run): the requirements of the
    manifest, the spec's scale environment ``env``, and per input (in the spec's order) its
    encoding ``scales`` and ``limbs``."""

    program: Program
    ctx: Context
    spec: CheckSpec
    req: Requirements
    env: dict[str, Any]
    scales: dict[str, float]
    limbs: dict[str, tuple[int, ...]]

    @property
    def names(self) -> tuple[str, ...]:
        """Input names in the spec's order (the order of the random draws)."""
        return tuple(self.spec.inputs)

    def kind(self, name: str) -> InputKind:
        return self.req.inputs[name].kind

    def prepared(self, secrets, values, objects, memory, keys) -> PreparedCheck:
        """A :class:`PreparedCheck` of one instance (what a check or a decryption of its outputs reads)."""
        return PreparedCheck(self.spec, self.program.manifest, self.ctx, secrets, self.env, values, objects, memory,
                             keys)

    def check_object(self, name: str, obj) -> None:
        """Raise :class:`BindingError` unless ``obj`` can feed input ``name``: a Ciphertext, Plaintext or
        Scalar as its kind wants, of ring degree N, holding every limb the program reads."""
        from caramel.ckks.encrypt import Ciphertext
        from caramel.ckks.plaintext import Plaintext, Scalar

        need = self.req.inputs[name]
        want = {InputKind.CIPHERTEXT: Ciphertext, InputKind.PLAINTEXT: Plaintext, InputKind.SCALAR: Scalar}[need.kind]
        if not isinstance(obj, want):
            raise BindingError(f"input {name} is a {need.kind}: give a {want.__name__} or its values, not a "
                               f"{type(obj).__name__}")
        width = obj.data.shape[-1] if isinstance(obj, Plaintext) else (obj.n if isinstance(obj, Ciphertext) else None)
        if width is not None and width != self.ctx.n:
            raise BindingError(f"input {name} has ring degree {width}, the run has N = {self.ctx.n}")
        lacking = sorted(set(need.limbs) - set(obj.limbs))
        if lacking:
            raise BindingError(f"input {name} lacks limbs {lacking} (has {list(obj.limbs)})")


def input_plan(program: Program, ctx: Context, spec: CheckSpec) -> InputPlan:
    """The :class:`InputPlan` of ``program`` at ``ctx`` under ``spec``: raises :class:`CheckError`
    when the spec does not fit the manifest or its expressions do not evaluate."""
    from caramel.ckks.check import _limb_count, _number, _scale_env  # prepare_check's own evaluation
    from caramel.ckks.expr import ExprError, evaluate

    req = requirements(program)
    problems = fit_problems(spec, req)
    if problems:
        raise CheckError(f"{spec.path} does not fit {program.manifest.path}:\n  " + "\n  ".join(problems))
    L = default_limb_count(req)
    try:
        env = _scale_env(ctx, L, spec.params)
    except ExprError as exc:
        raise CheckError(f"{spec.path}: params: {exc}") from None
    scales, limbs = {}, {}
    for name, ins in spec.inputs.items():
        where = f"{spec.path}: inputs.{name}"
        try:
            scales[name] = _number(evaluate(ins.scale, env), f"{where}.scale")
            limbs[name] = (req.inputs[name].limbs if ins.limbs is None else
                           tuple(range(_limb_count(evaluate(ins.limbs, env), len(ctx.primes), f"{where}.limbs"))))
        except ExprError as exc:
            raise CheckError(f"{where}: {exc}") from None
    return InputPlan(program, ctx, spec, req, env, scales, limbs)


#: Threads that draw the slot values of vector inputs for :func:`draw_inputs` (NumPy's generator runs without the
#: GIL; the instances of an executor share them).
DRAW_THREADS = max(1, min(16, cores.available() - 1))
#: Plaintexts per drawing task of :func:`draw_inputs`: enough that a task's Python steps are few beside its draws,
#: few enough that an instance's plaintexts spread over the threads.
DRAW_ROWS = 16
_drawers: list[ThreadPoolExecutor] = []


def _drawer() -> ThreadPoolExecutor:
    if not _drawers:
        _drawers.append(ThreadPoolExecutor(DRAW_THREADS, thread_name_prefix="caramel-draw"))
    return _drawers[0]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drawers.clear)  # a forked child has none of the parent's threads


class _Draw:
    """``size`` uniform values in [-m, m) of one input, from word ``offset`` on of the words counted from
    generator state ``start`` (:class:`_Uniform`): made where they are used (:func:`_fill_parts` writes them into
    their row), made when first asked for (:meth:`values`), or given."""

    __slots__ = ("size", "offset", "m", "start", "value")

    def __init__(self, size: int, offset: int, m):
        self.size, self.offset, self.m, self.start, self.value = size, offset, m, None, None

    def values(self) -> np.ndarray:
        if self.value is None:
            _make_draws([self])
        return self.value


def _scale_uniform(u: np.ndarray, m) -> None:
    """u <- low + (high - low) u in place, low = -m and high = m as NumPy's uniform takes them (doubles). NumPy's
    ``uniform(-m, m, size)`` is that for each raw double u (one rounded product, one rounded sum), so u drawn
    straight into place (``Generator.random``, the same words) then scaled here is its draw, bit for bit, without an
    array of its own."""
    low, high = float(-m), float(m)
    u *= high - low
    u += low


@functools.cache
def _scaling_is_uniform() -> bool:
    """Whether :func:`_scale_uniform` of ``Generator.random`` is NumPy's ``uniform`` here, checked once on 4096 draws
    at magnitudes whose products round (a NumPy built to fuse uniform's multiply-add into one rounding would differ in
    some last bits: there :func:`_draw_into` draws with ``uniform`` itself)."""
    for m in (0.7, 3.3e5):
        a, b = np.random.Generator(np.random.PCG64(7)), np.random.Generator(np.random.PCG64(7))
        want, got = a.uniform(-m, m, 4096), b.random(4096)
        _scale_uniform(got, m)
        if not np.array_equal(want.view(np.uint64), got.view(np.uint64)):
            return False
    return True


_draw_rngs = threading.local()


def _thread_rng() -> np.random.Generator:
    """This thread's generator, put in a draw's state before each use (:meth:`~caramel.ckks.sampling.PcgState.put`)."""
    rng = getattr(_draw_rngs, "rng", None)
    if rng is None:
        rng = _draw_rngs.rng = np.random.Generator(np.random.PCG64())
    return rng


def _word_runs(items, draw_of):
    """``items`` grouped by the first state of their draw (``draw_of(item)``), each group in the order of its
    words."""
    runs: dict[int, list] = {}
    for item in items:
        runs.setdefault(id(draw_of(item).start), []).append(item)
    for run in runs.values():
        run.sort(key=lambda item: draw_of(item).offset)
        yield run


def _make_draws(draws) -> None:
    """Make the values of the ``draws`` not yet made (:class:`_Draw`): per first state, this thread's generator put
    in that state and advanced from draw to draw in the order of their words."""
    for run in _word_runs([d for d in draws if d.value is None], lambda d: d):
        rng, at = run[0].start.put(_thread_rng()), 0
        for d in run:
            if d.offset > at:
                rng.bit_generator.advance(d.offset - at)
            d.value, at = rng.uniform(-d.m, d.m, d.size), d.offset + d.size


def _stretches(items, follows):
    """``items`` cut where an item does not follow on from the one before it (``follows(before, item)`` false): the
    lists of consecutive items, in order."""
    stretch: list = []
    for item in items:
        if stretch and not follows(stretch[-1], item):
            yield stretch
            stretch = []
        stretch.append(item)
    if stretch:
        yield stretch


def _end(span) -> int:
    """Where a span (:class:`_Draw`, lo) of :func:`_draw_into` ends in its flat rows."""
    return span[1] + span[0].size


def _draw_into(flat: np.ndarray, spans) -> None:
    """Draw ``spans``, pairs (:class:`_Draw`, lo) whose values land in ``flat[lo : lo + size]`` (:func:`_scale_uniform`:
    bit for bit), in few calls: each call releases and takes back the GIL, which the executor's other threads hold
    often. Draws whose words follow on from one another and whose places do too (an input's real and imaginary
    parts; consecutive inputs) are one ``Generator.random``; places that follow on with one magnitude are scaled in
    one step."""
    if not _scaling_is_uniform():  # one uniform call a draw, as the reference draws
        _make_draws([d for d, _ in spans])
        for d, lo in spans:
            flat[lo : lo + d.size] = d.value
        return
    for run in _word_runs(spans, lambda span: span[0]):
        rng, at = run[0][0].start.put(_thread_rng()), 0
        for stretch in _stretches(run, lambda a, b: b[0].offset == a[0].offset + a[0].size and b[1] == _end(a)):
            first, lo = stretch[0]
            if first.offset > at:
                rng.bit_generator.advance(first.offset - at)
            rng.random(out=flat[lo : _end(stretch[-1])])
            at = stretch[-1][0].offset + stretch[-1][0].size
    for stretch in _stretches(sorted(spans, key=lambda span: span[1]),
                              lambda a, b: b[1] == _end(a) and b[0].m == a[0].m):
        _scale_uniform(flat[stretch[0][1] : _end(stretch[-1])], stretch[0][0].m)


class _Uniform:
    """An instance's uniform draws, in input order. NumPy's ``rng.uniform(-m, m, size)`` takes one raw word
    of the generator per value (-m + 2m u, u the word's double), so each draw is known by its first word:
    :meth:`take` counts the words, and :meth:`flush` (before an encryption draws from ``rng``, and at the
    end) only moves a PCG64 ``rng`` past them (:func:`~caramel.ckks.sampling.advance_raw`) and keeps the
    state where they start. A draw of :data:`LAZY_SIZE` values or more is made where it is used
    (:func:`_fill_parts`, e.g. in a drawing thread, straight into its row) from a generator in that state advanced
    to its first word; the shorter ones at once, from one. Another bit generator draws them all at once, in order.
    """

    #: Draws at least this long are made where they are used.
    LAZY_SIZE = 1 << 12

    def __init__(self, rng):
        self.rng, self.pending, self.words = rng, [], 0

    def take(self, m, size: int) -> _Draw:
        self.pending.append(_Draw(size, self.words, m))
        self.words += size
        return self.pending[-1]

    def flush(self) -> None:
        from caramel.ckks.sampling import PcgState, advance_raw

        pending, total, self.pending, self.words = self.pending, self.words, [], 0
        start = PcgState.of(self.rng) if pending else None
        if start is None:
            for d in pending:
                d.value = self.rng.uniform(-d.m, d.m, d.size)
            return
        advance_raw(self.rng.bit_generator, total)
        for d in pending:
            d.start = start
        _make_draws([d for d in pending if d.size < self.LAZY_SIZE])


def _fill_parts(sources, n: int, parts: np.ndarray) -> None:
    """Write into ``parts`` (C-contiguous) the rows [re | im] (:func:`~caramel.ckks.encoding.slot_parts`) of vectors:
    each source a drawn pair (re, im or None: a real vector) of :class:`_Draw`, drawn straight into its half rows
    (:func:`_draw_into`), or a row [re | im] (given values)."""
    if not parts.flags.c_contiguous:
        raise ValueError("_fill_parts writes C-contiguous rows")
    half = n // 2
    flat = parts.reshape(-1)  # a view
    spans = []
    for r, src in enumerate(sources):
        if isinstance(src, np.ndarray):
            parts[r] = src
            continue
        for d, lo in zip(src, (r * n, r * n + half)):
            if d is None:
                flat[lo : lo + half] = 0.0
            elif d.value is not None:
                flat[lo : lo + half] = d.value
            else:
                spans.append((d, lo))
    _draw_into(flat, spans)


def reserve_rows(plan: InputPlan, names) -> None:
    """Make the calling thread's reused host rows (:meth:`~caramel.ckks.arith.base.ClientArith.host_rows`, on the
    client's current device) as large as :func:`draw_inputs` of ``names`` needs, before its first call: one row
    per plaintext input (a ciphertext's and a scalar's draws go elsewhere). A thread that prepares instances calls it
    while the run is set up, so that no instance waits for the buffer's allocation (pinned, on a GPU client)."""
    from caramel.ckks.device import chosen

    rows = sum(1 for name in names if plan.kind(name) is InputKind.PLAINTEXT)
    chosen().host_rows(rows, plan.ctx.n)


def draw_inputs(plan: InputPlan, secrets, rng, names, supplied: Mapping[str, Any] | None = None):
    """The inputs ``names`` of one instance as ``(objects, values)``: per name a Ciphertext, Plaintext or
    Scalar (the client's current device does the arithmetic; GPU arrays inside
    :func:`~caramel.ckks.device.keeping_inputs`) and the exact messages (:class:`DecodedInputs`).
    Values come from ``supplied`` (checked against the modulus of their limbs) or are drawn from ``rng``
    in the spec's order, as :func:`~caramel.ckks.check.prepare_check` draws them: the inputs not in
    ``names`` draw nothing, as supplied inputs there draw nothing.

    The same bits as there, made in bulk: the uniform draws counted, then made where they are used
    (:class:`_Uniform`: a plaintext's values :data:`DRAW_ROWS` at a time on :data:`DRAW_THREADS` threads, straight
    into the client's reused host rows, :meth:`~caramel.ckks.arith.base.ClientArith.host_rows`), the plaintexts
    encoded all at once on the client's device (:meth:`~caramel.ckks.arith.base.ClientArith.encode_rows`: the GPU
    client transforms them on the GPU) and put in NTT form there
    (:func:`~caramel.ckks.plaintext.plaintexts_from_coeffs`); a ciphertext is encoded there too and encrypted in its
    turn (its encryption draws from ``rng``)."""
    from caramel.ckks.check import _supplied_fits
    from caramel.ckks.device import chosen
    from caramel.ckks.encoding import slot_parts
    from caramel.ckks.encrypt import encrypt
    from caramel.ckks.plaintext import encode_scalar, plaintext_from_coeffs, plaintexts_from_coeffs

    ctx, spec = plan.ctx, plan.spec
    dev = chosen()
    wanted = set(names)
    supplied = supplied or {}
    n, slots = ctx.n, ctx.n // 2
    draws = _Uniform(rng)
    objects: dict[str, Any] = {}  # in input order
    sources: dict[str, Any] = {}  # per input: a scalar's value (or draw), a vector's source, then its encoding
    for name, ins in spec.inputs.items():
        if name not in wanted:
            continue
        scale, limbs, m = plan.scales[name], plan.limbs[name], ins.magnitude
        given = supplied.get(name)
        where = f"{spec.path}: inputs.{name}"
        objects[name] = None
        if ins.kind == InputKind.SCALAR:
            sources[name] = draws.take(m, 1) if given is None else _supplied_fits(where, given, scale, ctx, limbs)
            continue
        if given is None:
            sources[name] = (draws.take(m, slots), None if ins.real else draws.take(m, slots))
        else:
            sources[name] = slot_parts(_supplied_fits(where, given, scale, ctx, limbs), n)
        if ins.kind == InputKind.CIPHERTEXT:  # its encryption draws from rng, in input order
            draws.flush()
            parts = np.empty((1, n))
            _fill_parts([sources[name]], n, parts)
            coeffs = sources[name] = dev.encode_rows(parts, [scale], n, dev.xp.empty((1, n), dtype=np.int64))[0]
            objects[name] = encrypt(ctx, secrets.s, coeffs, limbs, rng, scale)
    draws.flush()
    plain = [name for name, obj in objects.items() if obj is None and spec.inputs[name].kind != InputKind.SCALAR]
    parts = dev.host_rows(len(plain), n)
    tasks = [_drawer().submit(_fill_parts, [sources[x] for x in plain[r0 : r0 + DRAW_ROWS]], n,
                              parts[r0 : r0 + DRAW_ROWS]) for r0 in range(0, len(plain), DRAW_ROWS)]
    for task in tasks:
        task.result()
    coeffs = dev.xp.empty((len(plain), n), dtype=np.int64)
    sources.update(zip(plain, dev.encode_rows(parts, [plan.scales[x] for x in plain], n, coeffs)))
    batched = [name for name in plain if sources[name].dtype == np.int64]
    if batched:
        rows = coeffs if len(batched) == len(plain) else dev.xp.stack([sources[x] for x in batched])
        objects.update(zip(batched, plaintexts_from_coeffs(ctx, rows, [plan.limbs[x] for x in batched],
                                                           [plan.scales[x] for x in batched])))
    values = DecodedInputs()
    for name in objects:  # in input order
        scale = plan.scales[name]
        if spec.inputs[name].kind == InputKind.SCALAR:
            got = sources[name]
            objects[name] = encode_scalar(ctx, float(got.values()[0]) if isinstance(got, _Draw) else got, scale,
                                          plan.limbs[name])
            values.put(name, objects[name].value / scale)
            continue
        values.put_decoded(name, sources[name], scale, n)
        if objects[name] is None:  # coefficients of 2^62 or more: Python ints
            objects[name] = plaintext_from_coeffs(ctx, sources[name], plan.limbs[name], scale)
    return objects, values


def input_image(req: Requirements, objects: Mapping[str, Any]) -> dict[Mem, Any]:
    """The memory image limbs of the inputs in ``objects`` (name -> Ciphertext, Plaintext or Scalar):
    every term of the manifest that one of them feeds, on every limb the program reads (read-only
    views; rows on the GPU as they are), as :func:`~caramel.ckks.bind.bind_inputs` binds them."""
    from caramel.ckks.plaintext import Plaintext, Scalar

    out: dict[Mem, Any] = {}
    for term, src in req.terms.items():
        obj = objects.get(src.name) if src.key is None else None
        if obj is None:
            continue
        for l in req.term_limbs[term]:
            row = obj.limb(l) if isinstance(obj, (Plaintext, Scalar)) else obj.limb(src.part, l)
            out[Mem(term, l)] = _readonly(row)
    return out


def key_image(req: Requirements, keys: Mapping) -> dict[Mem, Any]:
    """The memory image limbs of the evaluation keys (``keys``: key id -> EvalKey); a key the manifest
    names but ``keys`` lacks is a :class:`BindingError`."""
    out: dict[Mem, Any] = {}
    missing = [str(k) for k in req.keys if k not in keys]
    if missing:
        raise BindingError(f"the key set lacks {len(missing)} evaluation key(s) the program needs: "
                           f"{', '.join(missing[:8])}{'...' if len(missing) > 8 else ''}")
    for term, src in req.terms.items():
        if src.key is None:
            continue
        key = keys[src.key]
        for l in req.term_limbs[term]:
            if l not in key.limbs:
                raise BindingError(f"key {src.key} has no limb {l} (term {term})")
            out[Mem(term, l)] = _readonly(key.limb(src.part, l))
    return out


def _readonly(a):
    from caramel.arrays import is_device_array

    if is_device_array(a):
        return a
    v = np.asarray(a, dtype=np.uint32).view()
    v.setflags(write=False)
    return v


__all__ = ["InputPlan", "check_prime_count", "default_spec", "draw_inputs", "input_image", "input_plan", "key_image",
           "load_keyset", "max_limb", "output_digest", "prepare_inputs", "resolve_check", "run_setup"]
