"""Binding host data to a program's manifest (ISA.md sections 1, 5.3, 7 item 5, 8.6).

Memory image. :func:`bind_inputs` maps every input memory name ``Mem(term, limb)`` listed by the
global manifest (``program_inputs``) and by the per-chip manifests (``inputs<p>``, their ``Input``
section) to one NumPy array:

* ciphertext entry ``i<k> | x:c0|c1 | [..]``: row ``limb`` of that component of the Ciphertext 'x',
  (N,) uint32, NTT form;
* plaintext entry ``p<k> | x:p | [..]``: row ``limb`` of the Plaintext 'x', (N,) uint32, NTT form;
* scalar entry ``s<k> | x:s | [..]``: **a 0-d uint32 array** (shape ``()``) holding the residue of
  the scalar modulo q_limb (read it with ``int(a)`` or ``a.item()``);
* key entry ``k<k> | K:type:level:E:rot:c<h>:[D] | [..]``: row ``limb`` of half h of the logical key
  with id ``type:level:E:rot:[D]``. Each distinct key id is generated once (:func:`generate_evalkey`)
  and shared by every term and chip that names it; pass a dict as ``keys=`` to share keys across
  calls (it is filled in).

The arrays are read-only views (memory is a read-only input image, ISA.md decision 3): an executor
copies on ``load``.

Outputs. :func:`read_outputs` assembles each output name from its ``c0``/``c1`` entries' limbs in
a memory that holds the union of the chips' stores over the input image. ISA.md 8.6 aliasing: when an
output component is an unchanged input polynomial no store is emitted and the compiler renames the
*input* term's symbol to the output (e.g. ``i2 | w:c1`` while the Output section lists only ``w:c0``).
Such a ciphertext-section entry, whose ``name:part`` is missing from the Output section although
``name`` is an output, is an *aliased output term*: the output reads that part from the input term,
and the input term must still be bound to the original input. Which input it was is not in the
manifest; it is taken from ``aliases={"i2": "x:c1"}`` when given, else inferred from the partner term
(ciphertext terms are numbered c0 then c1: the partner of ``i2``/c1 is ``i1``/c0, whose symbol names
the input). An output whose both parts alias an input (``Output('w', x)``) cannot be recognised and
looks like an input named 'w'.

The output's limbs are the union of its Output-section limbs; every part must be available on all of
them (an aliased input term may hold more limbs; the extra ones are ignored).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, MutableMapping, Sequence

import numpy as np

from caramel.ckks.device import host_array
from caramel.ckks.encrypt import Ciphertext
from caramel.ckks.keys import EvalKey, Secrets, generate_evalkey
from caramel.ckks.plaintext import Plaintext, Scalar
from caramel.ckks.sampling import rng_of
from caramel.errors import BindingError
from caramel.arrays import is_device_array
from caramel.program import EvalKeyId, Manifest, Mem, Program, Section


class InputKind(str, enum.Enum):
    """What a named input is."""

    CIPHERTEXT = "ciphertext"
    PLAINTEXT = "plaintext"
    SCALAR = "scalar"

    def __str__(self) -> str:
        return self.value


_PART_KIND = {"c0": InputKind.CIPHERTEXT, "c1": InputKind.CIPHERTEXT, "p": InputKind.PLAINTEXT, "s": InputKind.SCALAR}
_SECTION_KIND = {
    Section.CIPHERTEXT: InputKind.CIPHERTEXT,
    Section.PLAINTEXT: InputKind.PLAINTEXT,
    Section.SCALAR: InputKind.SCALAR,
}
_VALUE_TYPE = {InputKind.CIPHERTEXT: Ciphertext, InputKind.PLAINTEXT: Plaintext, InputKind.SCALAR: Scalar}


@dataclass(frozen=True, slots=True)
class TermSource:
    """What an input term holds: part ``part`` of input ``name`` of kind ``kind``, or half ``part``
    of evaluation key ``key`` (then ``kind`` is None and ``name`` the key id text)."""

    kind: InputKind | None
    name: str
    part: str
    key: EvalKeyId | None = None


@dataclass(frozen=True, slots=True)
class InputNeed:
    """A named input: its kind, the union of limbs the program reads, the parts it names."""

    name: str
    kind: InputKind
    limbs: tuple[int, ...]
    parts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OutputNeed:
    """A named output: its limbs and, per part, the terms that may hold it (stores first, then
    aliased input terms)."""

    name: str
    limbs: tuple[int, ...]
    terms: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Requirements:
    """What a manifest needs from the host (see :func:`requirements`)."""

    inputs: Mapping[str, InputNeed]
    outputs: Mapping[str, OutputNeed]
    keys: tuple[EvalKeyId, ...]
    terms: Mapping[str, TermSource] = field(repr=False)
    term_limbs: Mapping[str, tuple[int, ...]] = field(repr=False)
    #: aliased output terms (ISA.md 8.6): term -> (output name, part)
    aliased: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def kinds(self) -> dict[str, InputKind]:
        """Input name -> kind."""
        return {n: i.kind for n, i in self.inputs.items()}

    def names(self, kind: InputKind | str | None = None) -> tuple[str, ...]:
        """Input names, optionally only those of one kind."""
        return tuple(n for n, i in self.inputs.items() if kind is None or i.kind == InputKind(kind))


def _manifests(source: Program | Manifest, chip_manifests: Sequence[Manifest] | None):
    if isinstance(source, Program):
        return source.manifest, tuple(source.chip_manifests if chip_manifests is None else chip_manifests)
    return source, tuple(chip_manifests or ())


def _parse_alias(text) -> tuple[str, str]:
    if isinstance(text, tuple):
        return text
    name, _, part = str(text).rpartition(":")
    if not name or part not in ("c0", "c1"):
        raise BindingError(f"alias must be '<name>:c0' or '<name>:c1', got {text!r}")
    return name, part


def _source_of(entry, kind: InputKind | None) -> TermSource:
    sym = entry.symbol
    if sym.key is not None:
        return TermSource(None, str(sym.key), sym.part, sym.key)
    return TermSource(kind or _PART_KIND.get(sym.part), sym.name, sym.part)


def requirements(
    source: Program | Manifest,
    chip_manifests: Sequence[Manifest] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Requirements:
    """Inputs (names, kinds, limbs), outputs, and evaluation key ids that a manifest needs.

    Inconsistencies (a term with two meanings, an aliased term that cannot be resolved, an unknown
    part) are collected in ``problems``; :func:`bind_inputs` raises them as one :class:`BindingError`.
    """
    manifest, chips = _manifests(source, chip_manifests)
    aliases = {t: _parse_alias(a) for t, a in (aliases or {}).items()}
    problems: list[str] = []
    out_entries = manifest.outputs
    out_names = {e.symbol.name for e in out_entries}
    out_parts = {(e.symbol.name, e.symbol.part) for e in out_entries}

    ct_entries = manifest.section(Section.CIPHERTEXT)
    by_term = {e.term: e for e in ct_entries}
    aliased: dict[str, tuple[str, str]] = {}
    for e in ct_entries:
        n, p = e.symbol.name, e.symbol.part
        if n in out_names and (n, p) not in out_parts:
            aliased[e.term] = (n, p)

    terms: dict[str, TermSource] = {}
    term_limbs: dict[str, set[int]] = {}

    def add(term: str, src: TermSource, limbs, where: str) -> None:
        old = terms.get(term)
        if old is not None and old != src:
            problems.append(f"{where}: term {term} names {src.name}:{src.part}, elsewhere {old.name}:{old.part}")
            return
        terms[term] = src
        term_limbs.setdefault(term, set()).update(limbs)

    for e in manifest.inputs:
        kind = _SECTION_KIND.get(e.section)
        where = f"{manifest.path}:{e.line}"
        if e.term in aliased:
            out_name, part = aliased[e.term]
            if e.term in aliases:
                name, apart = aliases[e.term]
            else:
                name, apart = _infer_alias(e.term, part, by_term, aliased)
            if name is None:
                problems.append(
                    f"{where}: term {e.term} holds output {out_name}:{part} unchanged from an input that "
                    f"cannot be inferred; pass aliases={{'{e.term}': '<input>:{part}'}}"
                )
                continue
            add(e.term, TermSource(InputKind.CIPHERTEXT, name, apart), e.limbs, where)
            continue
        src = _source_of(e, kind)
        if src.key is None and (src.kind is None or _PART_KIND.get(src.part) != src.kind):
            problems.append(f"{where}: symbol {e.symbol} does not fit section {e.section.value}")
            continue
        add(e.term, src, e.limbs, where)
    for cm in chips:
        for e in cm.section(Section.INPUT):
            where = f"{cm.path}:{e.line}"
            if e.term in terms:
                term_limbs[e.term].update(e.limbs)
                continue
            if e.term in aliased:  # unresolved alias, already reported
                continue
            src = _source_of(e, None)
            if src.key is None and src.kind is None:
                problems.append(f"{where}: symbol {e.symbol} is not an input")
                continue
            add(e.term, src, e.limbs, where)

    inputs: dict[str, InputNeed] = {}
    keys: dict[EvalKeyId, None] = {}
    for term, src in terms.items():
        if src.key is not None:
            keys.setdefault(src.key)
            continue
        old = inputs.get(src.name)
        limbs = set(term_limbs[term])
        parts = {src.part}
        if old is not None:
            if old.kind != src.kind:
                problems.append(f"input {src.name} is named both as {old.kind} and as {src.kind}")
                continue
            limbs |= set(old.limbs)
            parts |= set(old.parts)
        inputs[src.name] = InputNeed(src.name, src.kind, tuple(sorted(limbs)), tuple(sorted(parts)))

    outputs: dict[str, OutputNeed] = {}
    for name in dict.fromkeys(e.symbol.name for e in out_entries):
        es = [e for e in out_entries if e.symbol.name == name]
        limbs = tuple(sorted({l for e in es for l in e.limbs}))
        by_part: dict[str, list[str]] = {"c0": [], "c1": []}
        for e in es:
            if e.symbol.part not in by_part:
                problems.append(f"{manifest.path}:{e.line}: output symbol {e.symbol} is not a ciphertext part")
                continue
            by_part[e.symbol.part].append(e.term)
        for term, (n, p) in aliased.items():
            if n == name:
                by_part[p].append(term)
        outputs[name] = OutputNeed(name, limbs, {p: tuple(t) for p, t in by_part.items()})

    return Requirements(
        inputs=inputs,
        outputs=outputs,
        keys=tuple(keys),
        terms=terms,
        term_limbs={t: tuple(sorted(l)) for t, l in term_limbs.items()},
        aliased=aliased,
        problems=tuple(problems),
    )


def _infer_alias(term: str, part: str, by_term, aliased) -> tuple[str | None, str]:
    """Input name for an aliased term from its partner (c0 = i<k>, c1 = i<k+1>), or (None, part)."""
    try:
        idx = int(term[1:])
    except ValueError:
        return None, part
    partner = f"{term[0]}{idx - 1 if part == 'c1' else idx + 1}"
    other = "c0" if part == "c1" else "c1"
    e = by_term.get(partner)
    if e is None or partner in aliased or e.symbol.part != other:
        return None, part
    return e.symbol.name, part


def input_mems(
    source: Program | Manifest, chip_manifests: Sequence[Manifest] | None = None
) -> set[Mem]:
    """Every input memory name ``Mem(term, limb)`` the manifests list (all sections but Output)."""
    manifest, chips = _manifests(source, chip_manifests)
    mems = {Mem(e.term, l) for e in manifest.inputs for l in e.limbs}
    for cm in chips:
        mems |= {Mem(e.term, l) for e in cm.section(Section.INPUT) for l in e.limbs}
    return mems


def _readonly(a) -> np.ndarray:
    """A read-only uint32 view of the row ``a``; a row kept on the GPU by the GPU client (a key or
    an input, no write flag there) as it is."""
    if is_device_array(a):
        return a
    v = np.asarray(a, dtype=np.uint32).view()
    v.setflags(write=False)
    return v


def bind_inputs(
    source: Program | Manifest,
    ctx,
    secrets: Secrets | None,
    values: Mapping[str, Ciphertext | Plaintext | Scalar],
    *,
    chip_manifests: Sequence[Manifest] | None = None,
    rng=None,
    keys: MutableMapping[EvalKeyId, EvalKey] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> dict[Mem, np.ndarray]:
    """The memory image of a program's inputs (see module docstring).

    ``values`` maps every input name to a :class:`Ciphertext`, :class:`Plaintext` or
    :class:`Scalar` holding at least the limbs the manifests list (extra names are ignored).
    Evaluation keys come from ``keys`` (a dict, filled in with generated keys) or are generated from
    ``secrets`` with ``rng``. Raises :class:`BindingError` listing *all* problems at once; its
    ``missing`` attribute lists the missing input names.
    """
    req = requirements(source, chip_manifests, aliases)
    problems = list(req.problems)
    missing = sorted(n for n in req.inputs if n not in values)
    if missing:
        problems.insert(0, f"missing inputs: {', '.join(missing)}")
    for name, need in req.inputs.items():
        if name not in values:
            continue
        v = values[name]
        want = _VALUE_TYPE[need.kind]
        if not isinstance(v, want):
            problems.append(f"input {name} must be a {need.kind} ({want.__name__}), got {type(v).__name__}")
            continue
        if getattr(v, "n", ctx.n) != ctx.n or (isinstance(v, Plaintext) and v.data.shape[1] != ctx.n):
            problems.append(f"input {name} has the wrong ring dimension (context N = {ctx.n})")
            continue
        lacking = sorted(set(need.limbs) - set(v.limbs))
        if lacking:
            problems.append(f"input {name} lacks limbs {lacking} (has {list(v.limbs)})")

    keys = {} if keys is None else keys
    needed_keys = [k for k in req.keys if k not in keys]
    if needed_keys and secrets is None:
        problems.append(f"secrets are needed to generate keys {', '.join(map(str, needed_keys))}")
    if problems:
        err = BindingError("cannot bind program inputs:\n  " + "\n  ".join(problems))
        err.missing = missing  # type: ignore[attr-defined]
        err.problems = problems  # type: ignore[attr-defined]
        raise err

    rng = rng_of(rng)
    for k in needed_keys:
        try:
            keys[k] = generate_evalkey(ctx, k, secrets, rng)
        except ValueError as exc:
            problems.append(str(exc))
    key_problems = []
    memory: dict[Mem, np.ndarray] = {}
    for term, src in req.terms.items():
        for l in req.term_limbs[term]:
            if src.key is not None:
                key = keys.get(src.key)
                if key is None:
                    continue
                if l not in key.limbs:
                    key_problems.append(f"key {src.key} has no limb {l} (term {term})")
                    continue
                memory[Mem(term, l)] = _readonly(key.limb(src.part, l))
            else:
                v = values[src.name]
                arr = v.limb(l) if isinstance(v, (Plaintext, Scalar)) else v.limb(src.part, l)
                memory[Mem(term, l)] = _readonly(arr)
    problems += key_problems
    if problems:
        err = BindingError("cannot bind program inputs:\n  " + "\n  ".join(problems))
        err.missing = []  # type: ignore[attr-defined]
        err.problems = problems  # type: ignore[attr-defined]
        raise err
    return memory


def write_outputs(source: Program | Manifest, outputs: Mapping[str, Ciphertext]) -> dict[Mem, np.ndarray]:
    """The stores a correct run would make: every Output-section entry's limbs of ``outputs[name]``.

    The inverse of :func:`read_outputs` (for testing executors and checks); aliased parts (ISA.md 8.6)
    are not written, since a run does not store them either.
    """
    manifest, _ = _manifests(source, ())
    memory: dict[Mem, np.ndarray] = {}
    for e in manifest.outputs:
        ct = outputs[e.symbol.name]
        for l in e.limbs:
            memory[Mem(e.term, l)] = ct.limb(e.symbol.part, l)
    return memory


def read_outputs(
    source: Program | Manifest,
    memory: Mapping[Mem, np.ndarray],
    *,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Ciphertext]:
    """Every output ciphertext assembled from ``memory`` (union of chips' stores over the input image).

    Per output name and part, limb l is taken from the first of the part's terms (stores, then an
    aliased input term, ISA.md 8.6) that has ``Mem(term, l)`` in memory. Raises
    :class:`BindingError` naming every missing output limb. The ciphertexts' ``scale`` is None.
    """
    manifest, _ = _manifests(source, ())
    req = requirements(manifest, (), aliases)
    out: dict[str, Ciphertext] = {}
    problems: list[str] = []
    for name, need in req.outputs.items():
        rows: dict[str, list[np.ndarray]] = {}
        for part in ("c0", "c1"):
            terms = need.terms.get(part, ())
            if not terms:
                problems.append(f"output {name} has no term for {part}")
                continue
            got = []
            for l in need.limbs:
                arr = next((memory[Mem(t, l)] for t in terms if Mem(t, l) in memory), None)
                if arr is None:
                    problems.append(f"output {name}:{part} limb {l} missing (terms {', '.join(terms)})")
                else:
                    got.append(np.asarray(host_array(arr), dtype=np.uint32))  # an aliased input: maybe on the GPU
            rows[part] = got
        if len(rows.get("c0", ())) == len(rows.get("c1", ())) == len(need.limbs) and need.limbs:
            out[name] = Ciphertext(np.stack(rows["c0"]), np.stack(rows["c1"]), need.limbs)
    if problems:
        raise BindingError("cannot read program outputs:\n  " + "\n  ".join(problems))
    return out
