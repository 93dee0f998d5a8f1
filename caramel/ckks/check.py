"""Check files: how to verify a compiled program by encryption, execution and decryption.

A check file is TOML (read with :mod:`tomllib`) describing, for one program family and valid for
every limb count and chip count, the inputs to encrypt and, per output, the plaintext formula it
must decrypt to. Format (unknown keys are errors, to catch typos)::

    description = "Mul: z = rescale(relin(x*y))"     # optional

    [params]                      # optional named constants, evaluated in order; each may use the
    T = "S**2"                    # built-ins below and earlier params

    [inputs.x]                    # one table per input name of the manifest (names must match)
    kind = "ciphertext"           # "ciphertext" | "plaintext" | "scalar" (must match the manifest)
    scale = "S"                   # expression: the encoding scale
    limbs = "L"                   # optional expression: encrypt on limbs 0..limbs-1
                                  #   (default: exactly the limbs the manifests list for the input)
    magnitude = 1.0               # optional: real and imaginary parts drawn uniform in [-m, m]
    real = false                  # optional: draw real values only (scalars are always real)

    [let]                         # optional named formulas over the inputs, evaluated in order at
    a1 = "x + rot(x, 1)"          # each output (may use inputs, params, functions, earlier lets);
    a2 = "a1 + rot(a1, 2)"        # a rotation-sum written level by level

    [outputs.z]                   # one table per output name of the manifest
    formula = "x * y"             # expected slots, over the decoded inputs (see below)
    scale = "S**2 / q[L-1]"       # the output's true scale: decode the decryption at this scale
    modulus = "q[0]*q[1]*q[2]"    # optional: reduce the centred decrypted coefficients centred
                                  #   modulo this integer before decoding (BootstrapModRaise)
    key = "s"                     # optional: decrypt under "s" (default) or "s_eph"
    tolerance_bits = 10           # pass if precision >= this (a positive finite number); or by mode:
    # tolerance_bits = { exact = 10, textbook = { 1024 = 10, 4096 = 9, 65536 = 4 }, default = 8 }

Tolerance tables: the entry for the arithmetic mode (``exact``, ``textbook``, ``emulator``), else
``default``; an entry is a number or a table keyed by N thresholds, where the smallest threshold
>= N applies (the largest one above every threshold). A mode with no entry and no default is
measured but not judged (``passed`` is None). Thresholds are powers of two up to 65536; every
bar is a positive finite number of bits.

Expressions (:mod:`caramel.ckks.expr`, a whitelist-checked ``ast`` evaluator, never ``eval``):
numbers (also complex, ``1j``), ``+ - * / **``, unary ``-``, ``q[i]`` indexing, and the names

* ``S`` = 2^28 (the fresh scale), ``q`` = the 64 primes (``q[L-1]``), ``N`` ring dimension,
  ``slots`` = N/2, ``L`` = the program's input limb count: the largest ciphertext input's limb count
  (max limb index + 1) in the manifest, unless given explicitly to :func:`prepare_check`;
* params;
* the reductions ``sum(v)``, ``prod(v)``, ``sum(E for i in range(a, b))``, ``prod(E for i in
  range(a, b))`` (a slot sum, a product over the levels such as a repeated squaring's true scale
  ``S**8 / prod(q[L-i]**2**(3-i) for i in range(1, 4))``);
* in formulas and lets only: every input name (a ciphertext or plaintext is its vector of N/2 decoded slots,
  a scalar is its decoded real number) and the functions ``rot(v, k)`` (rotate LEFT by k, slot i
  receives slot i+k; negative k rotates right; k acts modulo N/2, ISA.md decision 6), ``conj(v)``,
  ``scaled(v, s)`` = v * s / scale_out, for a term that reaches the output at true scale s while the
  output is decoded at scale_out (sums of terms that went through different rescales).

What a check file can cost is bounded: the file is at most ``MAX_CHECK_BYTES`` bytes of UTF-8,
nested at most ``MAX_TOML_DEPTH`` tables or arrays deep; expressions have the limits of
:mod:`caramel.ckks.expr` (length, nodes, depth, steps, integer size; no repetition of sequences), at
most ``MAX_LETS`` lets (each one vector of N/2 slots), and ``limbs`` cannot exceed the primes. An
output whose true scale times its largest expected value does not fit half its modulus cannot be
decrypted to that value: the result says so (and fails) instead of printing a precision.

"Decoded inputs" are the exact messages that were encrypted: decode(encode(v)) for vectors and
round(c * scale) / scale for scalars.

Measures, per output: err_j = |decoded_j - expected_j| over the N/2 slots; with
M = max(1, max_j |expected_j|): precision = -log2(max_j err_j / M) and median precision
= -log2(median_j err_j / M), in bits (inf when the error is 0, -inf when decoding overflows).
"""

from __future__ import annotations

import enum
import math
import re
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections import ChainMap
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import numpy as np

from caramel import cores
from caramel.ckks.bind import InputKind, Requirements, bind_inputs, read_outputs, requirements
from caramel.ckks.device import host_array
from caramel.ckks.encoding import decode, encode, rotate_slots
from caramel.ckks.encrypt import Ciphertext, decrypt_values, encrypt
from caramel.ckks.expr import REDUCTIONS, ExprError, evaluate, parse
from caramel.ckks.keys import EvalKey, Secrets
from caramel.infiles import NotRegularFile, TooLarge, read_bounded
from caramel.ckks.plaintext import encode_scalar, plaintext_from_coeffs
from caramel.ckks.sampling import rng_of
from caramel.errors import CaramelError
from caramel.program import EvalKeyId, Manifest, Mem, Program

def _ascii(pattern: str):
    """A regular expression whose ``\\d`` and ``\\w`` are ASCII only (Python's default ``\\d``
    also matches other scripts' digits)."""
    return re.compile(pattern, re.ASCII)


#: Scale of a fresh input, 2^28.
FRESH_SCALE = 2**28
#: Where the family check files live: ``caramel/checks/<Family>.toml``, package data (``programs/checks`` links here).
CHECKS_DIR = Path(__file__).resolve().parents[1] / "checks"
MODES = ("exact", "textbook", "emulator")

_BUILTINS = frozenset({"S", "q", "N", "slots", "L"})
_FUNCTIONS = frozenset({"rot", "conj", "scaled"})
#: Names that a param, input or let may not take (reductions and the ``range`` of their loops).
_RESERVED = _BUILTINS | _FUNCTIONS | REDUCTIONS | {"range"}
_TOP_KEYS = {"description", "params", "let", "inputs", "outputs"}
#: Bounds on what a check file may cost (see the module docstring).
MAX_CHECK_BYTES = 1 << 20
MAX_TOML_DEPTH = 32
MAX_LETS = 256
_INPUT_KEYS = {"kind", "scale", "limbs", "magnitude", "real"}
_OUTPUT_KEYS = {"formula", "scale", "modulus", "key", "tolerance_bits"}
_IDENT = _ascii(r"^[A-Za-z_][A-Za-z0-9_]*$")
_N_KEY = _ascii(r"[0-9]{1,6}")  # a ring dimension N as a key of tolerance_bits (ASCII digits only)
_PROGRAM_NAME = _ascii(r"^(?P<family>[A-Za-z0-9-]+)_(?P<limbs>\d+)L(?:_(?P<chips>\d+)c)?$")


class CheckError(CaramelError):
    """A malformed check file, or a check file that does not fit a program's manifest."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    kind: InputKind
    scale: str
    limbs: str | None = None
    magnitude: float = 1.0
    real: bool = False


@dataclass(frozen=True)
class OutputSpec:
    name: str
    formula: str
    scale: str
    modulus: str | None = None
    key: str = "s"
    tolerance_bits: Any = None

    def tolerance(self, mode: Any, n: int) -> float | None:
        """The bar for ``mode`` at ring dimension ``n`` (None: not judged)."""
        return resolve_tolerance(self.tolerance_bits, mode_name(mode), n)


@dataclass(frozen=True)
class CheckSpec:
    """A parsed, validated check file."""

    path: str
    description: str
    params: Mapping[str, str]
    inputs: Mapping[str, InputSpec]
    outputs: Mapping[str, OutputSpec]
    lets: Mapping[str, str] = field(default_factory=dict)
    #: Whether the outputs' scales are the program's (a check file says them); False for the
    #: random inputs of a run without one (:func:`caramel.api.default_spec`), whose outputs cannot
    #: be decoded: their scale is unknown.
    scales_known: bool = True


def mode_name(mode: Any) -> str:
    """'exact' | 'textbook' | 'emulator' from a string or an enum member (e.g. ``caramel.ring.Mode``)."""
    if isinstance(mode, enum.Enum):
        mode = mode.value if isinstance(mode.value, str) else mode.name
    return str(mode).lower()


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bar(v: Any, where: str) -> None:
    """A tolerance bar: a positive finite number of bits (not a boolean, NaN or infinity)."""
    if not _is_number(v) or not math.isfinite(v) or v <= 0:
        raise CheckError(f"{where}: a tolerance must be a positive finite number of bits, got {v!r}")


def _validate_tolerance(tol: Any, where: str) -> None:
    if tol is None:
        return
    if not isinstance(tol, dict):
        _bar(tol, f"{where}.tolerance_bits")
        return
    for mode, entry in tol.items():
        if mode not in MODES and mode != "default":
            raise CheckError(f"{where}: unknown mode {mode!r} in tolerance_bits (keys: {', '.join(MODES)}, default)")
        if not isinstance(entry, dict):
            _bar(entry, f"{where}.tolerance_bits.{mode}")
            continue
        if not entry:
            raise CheckError(f"{where}: tolerance_bits.{mode} must be a number or a table keyed by N")
        for k, v in entry.items():
            if not _N_KEY.fullmatch(str(k)) or int(k) < 2 or int(k) > 65536 or int(k) & (int(k) - 1):
                raise CheckError(f"{where}: unknown key {k!r} in tolerance_bits.{mode} (keys are ring dimensions N, "
                                 "powers of two up to 65536)")
            _bar(v, f"{where}.tolerance_bits.{mode}.{k}")


def resolve_tolerance(tol: Any, mode: str, n: int) -> float | None:
    """Apply the tolerance rules of the module docstring."""
    if tol is None or _is_number(tol):
        return None if tol is None else float(tol)
    entry = tol.get(mode, tol.get("default"))
    if entry is None or _is_number(entry):
        return None if entry is None else float(entry)
    table = sorted((int(k), float(v)) for k, v in entry.items())
    for threshold, bits in table:
        if n <= threshold:
            return bits
    return table[-1][1]


def _expr(text: Any, names, functions, where: str) -> str:
    if not isinstance(text, str):
        raise CheckError(f"{where}: expected an expression string, got {text!r}")
    try:
        parse(text, names, functions)
    except ExprError as exc:
        raise CheckError(f"{where}: {exc}") from None
    return text


def parse_check(data: Mapping[str, Any], path: str = "<check>") -> CheckSpec:
    """Validate a check document (already loaded TOML) into a :class:`CheckSpec`."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise CheckError(f"{path}: unknown top-level keys {sorted(unknown)}")
    description = data.get("description", "")
    params_raw = data.get("params", {})
    inputs_raw = data.get("inputs", {})
    outputs_raw = data.get("outputs", {})
    for what, v in (("params", params_raw), ("inputs", inputs_raw), ("outputs", outputs_raw)):
        if not isinstance(v, dict):
            raise CheckError(f"{path}: [{what}] must be a table")
    if not outputs_raw:
        raise CheckError(f"{path}: no [outputs.<name>] table")

    names = set(_BUILTINS)
    params: dict[str, str] = {}
    for name, text in params_raw.items():
        if not _IDENT.match(name) or name in _RESERVED:
            raise CheckError(f"{path}: bad or reserved parameter name {name!r}")
        params[name] = _expr(text, names, frozenset(), f"{path}: params.{name}")
        names.add(name)
    scale_names = frozenset(names)

    inputs: dict[str, InputSpec] = {}
    for name, t in inputs_raw.items():
        where = f"{path}: inputs.{name}"
        if not _IDENT.match(name) or name in scale_names or name in _RESERVED:
            raise CheckError(f"{where}: bad or reserved input name")
        if not isinstance(t, dict):
            raise CheckError(f"{where} must be a table")
        if set(t) - _INPUT_KEYS:
            raise CheckError(f"{where}: unknown keys {sorted(set(t) - _INPUT_KEYS)}")
        try:
            kind = InputKind(t.get("kind"))
        except ValueError:
            raise CheckError(f"{where}: kind must be ciphertext, plaintext or scalar") from None
        if "scale" not in t:
            raise CheckError(f"{where}: scale is required")
        mag = t.get("magnitude", 1.0)
        if not _is_number(mag) or not 0 < mag < 2**20:
            raise CheckError(f"{where}: magnitude must be a positive number")
        real = t.get("real", False)
        if not isinstance(real, bool):
            raise CheckError(f"{where}: real must be true or false")
        limbs = t.get("limbs")
        inputs[name] = InputSpec(
            name,
            kind,
            _expr(t["scale"], scale_names, frozenset(), f"{where}.scale"),
            None if limbs is None else _expr(limbs, scale_names, frozenset(), f"{where}.limbs"),
            float(mag),
            real,
        )

    lets_raw = data.get("let", {})
    if not isinstance(lets_raw, dict):
        raise CheckError(f"{path}: [let] must be a table")
    if len(lets_raw) > MAX_LETS:
        raise CheckError(f"{path}: more than {MAX_LETS} lets")
    formula_names = scale_names | set(inputs)
    lets: dict[str, str] = {}
    for name, text in lets_raw.items():
        if not _IDENT.match(name) or name in formula_names or name in _RESERVED:
            raise CheckError(f"{path}: let.{name}: bad, reserved or already declared name")
        lets[name] = _expr(text, formula_names, _FUNCTIONS, f"{path}: let.{name}")
        formula_names = formula_names | {name}
    outputs: dict[str, OutputSpec] = {}
    for name, t in outputs_raw.items():
        where = f"{path}: outputs.{name}"
        if not isinstance(t, dict):
            raise CheckError(f"{where} must be a table")
        if set(t) - _OUTPUT_KEYS:
            raise CheckError(f"{where}: unknown keys {sorted(set(t) - _OUTPUT_KEYS)}")
        for req in ("formula", "scale"):
            if req not in t:
                raise CheckError(f"{where}: {req} is required")
        key = t.get("key", "s")
        if key not in ("s", "s_eph"):
            raise CheckError(f"{where}: key must be 's' or 's_eph'")
        _validate_tolerance(t.get("tolerance_bits"), where)
        outputs[name] = OutputSpec(
            name,
            _expr(t["formula"], formula_names, _FUNCTIONS, f"{where}.formula"),
            _expr(t["scale"], scale_names, frozenset(), f"{where}.scale"),
            None if t.get("modulus") is None else _expr(t["modulus"], scale_names, frozenset(), f"{where}.modulus"),
            key,
            t.get("tolerance_bits"),
        )
    if not isinstance(description, str):
        raise CheckError(f"{path}: description must be a string")
    return CheckSpec(str(path), description, params, inputs, outputs, lets)


def _toml_depth(text: str) -> int:
    """An upper bound on the nesting of TOML arrays and inline tables (brackets outside strings
    are counted as if every one opened a level; comments and strings are skipped roughly)."""
    depth = deepest = 0
    quote = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def load_check(path: str | Path) -> CheckSpec:
    """Read and validate a check file: a regular file of at most ``MAX_CHECK_BYTES`` bytes of UTF-8
    TOML, nested at most ``MAX_TOML_DEPTH`` deep (errors name the file and the reason)."""
    p = Path(path)
    try:
        raw = read_bounded(p, MAX_CHECK_BYTES)
    except TooLarge as exc:
        raise CheckError(f"{p}: {exc.size} bytes; a check file has at most {MAX_CHECK_BYTES}") from None
    except NotRegularFile:
        raise CheckError(f"{p}: not a regular file") from None
    except OSError as exc:
        raise CheckError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if _toml_depth(text) > MAX_TOML_DEPTH:
        raise CheckError(f"{p}: arrays or tables nested deeper than {MAX_TOML_DEPTH}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CheckError(f"{p}: {exc}") from None
    except (RecursionError, MemoryError):
        raise CheckError(f"{p}: nested too deeply to read") from None
    return parse_check(data, str(p))


def family_of(program_name: str) -> str:
    """``Mul`` for ``Mul_4L_1c`` (a bare family name is returned unchanged)."""
    name = Path(program_name).name
    m = _PROGRAM_NAME.match(name)
    return m.group("family") if m else name


def check_path(program_name: str, checks_dir: str | Path | None = None) -> Path:
    """``<checks_dir>/<Family>.toml`` for a program (folder) name or a family name."""
    return Path(checks_dir or CHECKS_DIR) / f"{family_of(program_name)}.toml"


# ---------------------------------------------------------------------------------------------
# Running a check


class DecodedInputs(Mapping[str, Any]):
    """The inputs' exact messages by name (:class:`PreparedCheck`'s ``values``): a vector input's
    decode(encode(v)) is computed on first use (an FFT each; a run whose formulas never read an input,
    e.g. unjudged outputs, computes none), a scalar's value is given. Threads may read it at once (the checks of
    two instances submitted with the same ready inputs): a value is computed once, and no reader sees it before."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._pending: dict[str, tuple[np.ndarray, float, int]] = {}
        self._lock = threading.Lock()

    def put(self, name: str, value: Any) -> None:
        self._items[name] = value

    def put_decoded(self, name: str, coeffs, scale: float, n: int) -> None:
        """``name`` is decode(coeffs, scale, n), computed when first read (``coeffs`` on the host, or on a GPU:
        copied down then)."""
        self._items[name] = None
        self._pending[name] = (coeffs, scale, n)

    def __getitem__(self, name: str) -> Any:
        with self._lock:
            pending = self._pending.pop(name, None)
            if pending is not None:
                coeffs, scale, n = pending
                self._items[name] = decode(host_array(coeffs), scale, n)
            return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(eq=False)
class PreparedCheck:
    """Everything needed to judge a run: the spec, the encrypted inputs and the input memory image."""

    spec: CheckSpec
    manifest: Manifest
    ctx: Any
    secrets: Secrets
    env: dict[str, Any]
    values: Mapping[str, Any]
    objects: dict[str, Any]
    memory: dict[Mem, np.ndarray]
    keys: MutableMapping[EvalKeyId, EvalKey]
    aliases: Mapping[str, str] | None = None

    def __repr__(self) -> str:  # short: the memory image and keys are large
        return (f"PreparedCheck({self.spec.path!r}, {len(self.objects)} inputs, {len(self.memory)} limbs, "
                f"{len(self.keys)} keys)")


@dataclass(frozen=True)
class OutputResult:
    """How close one decrypted output came to its formula (bits; higher is better)."""

    name: str
    precision_bits: float
    median_bits: float
    max_error: float
    median_error: float
    tolerance_bits: float | None
    passed: bool | None
    scale: float
    limbs: tuple[int, ...]
    #: Why the precision means nothing (the expected values overflow the output modulus), or None.
    overflow: str | None = None

    def __str__(self) -> str:
        bar = "no bar" if self.tolerance_bits is None else f"bar {self.tolerance_bits:g}"
        verdict = {True: "PASS", False: "FAIL", None: "----"}[self.passed]
        if self.overflow:
            return f"{verdict} {self.name}: {self.overflow}, {bar}, {len(self.limbs)} limbs"
        return (
            f"{verdict} {self.name}: precision {self.precision_bits:.1f} bits (median {self.median_bits:.1f}), "
            f"{bar}, {len(self.limbs)} limbs"
        )


@dataclass(frozen=True)
class CheckReport:
    """Per-output results of one checked run, with the parameters that produced them."""

    check: str
    mode: str
    n: int
    secrets: Mapping[str, str]
    results: Mapping[str, OutputResult]

    @property
    def passed(self) -> bool:
        """No output failed its bar (outputs without a bar do not count)."""
        return all(r.passed is not False for r in self.results.values())

    def summary(self) -> str:
        head = f"{self.check} [mode {self.mode}, N = {self.n}, s {self.secrets.get('s')}, s_eph {self.secrets.get('s_eph')}]"
        return "\n".join([head] + [f"  {r}" for r in self.results.values()])


def _scale_env(ctx, L: int, params: Mapping[str, str]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "S": FRESH_SCALE,
        "q": tuple(int(p) for p in ctx.primes),
        "N": int(ctx.n),
        "slots": int(ctx.n) // 2,
        "L": int(L),
    }
    for name, text in params.items():
        env[name] = evaluate(text, env)
    return env


def _number(v: Any, what: str) -> float:
    if isinstance(v, np.ndarray) or not isinstance(v, (int, float)) or isinstance(v, bool):
        raise CheckError(f"{what} must evaluate to a real number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or f <= 0:
        raise CheckError(f"{what} must be a positive finite number, got {v}")
    return f


def _integer(v: Any, what: str) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckError(f"{what} must evaluate to a positive integer, got {v!r}")
    return v


def _limb_count(v: Any, primes: int, what: str) -> int:
    """An input's ``limbs``: a positive integer no larger than the context's prime count."""
    count = _integer(v, what)
    if count > primes:
        raise CheckError(f"{what} = {count} is beyond the context's {primes} primes")
    return count


def default_limb_count(req) -> int:
    """L: max limb index + 1 over ciphertext inputs (else over all non-key inputs; 0 if none)."""
    for kinds in ((InputKind.CIPHERTEXT,), tuple(InputKind)):
        ls = [max(i.limbs) + 1 for i in req.inputs.values() if i.kind in kinds and i.limbs]
        if ls:
            return max(ls)
    return 0


def _manifest_of(source: Program | Manifest) -> Manifest:
    return source.manifest if isinstance(source, Program) else source


def fit_problems(spec: CheckSpec, req: Requirements) -> list[str]:
    """Why ``spec`` does not fit a manifest's requirements (input names and kinds, output names);
    empty when it fits."""
    problems = []
    for name, need in req.inputs.items():
        if name not in spec.inputs:
            problems.append(f"manifest input {name} ({need.kind}) is not declared")
        elif spec.inputs[name].kind != need.kind:
            problems.append(f"input {name} is a {need.kind} in the manifest, {spec.inputs[name].kind} in the check")
    problems += [f"declared input {n} is not in the manifest" for n in spec.inputs if n not in req.inputs]
    problems += [f"manifest output {n} has no formula" for n in req.outputs if n not in spec.outputs]
    problems += [f"declared output {n} is not in the manifest" for n in spec.outputs if n not in req.outputs]
    return problems


def output_scales(spec: CheckSpec, ctx, L: int) -> dict[str, tuple[float, int | None]]:
    """(true scale, modulus or None) of every output at limb count ``L`` (validates the expressions)."""
    try:
        env = _scale_env(ctx, L, spec.params)
    except ExprError as exc:
        raise CheckError(f"{spec.path}: params: {exc}") from None
    out = {}
    for name, o in spec.outputs.items():
        where = f"{spec.path}: outputs.{name}"
        try:
            scale = _number(evaluate(o.scale, env), f"{where}.scale")
            modulus = None if o.modulus is None else _integer(evaluate(o.modulus, env), f"{where}.modulus")
        except ExprError as exc:
            raise CheckError(f"{where}: {exc}") from None
        out[name] = (scale, modulus)
    return out


def prepare_check(
    spec: CheckSpec | str | Path,
    source: Program | Manifest,
    ctx,
    *,
    secrets: Secrets | None = None,
    rng=None,
    chip_manifests: Sequence[Manifest] | None = None,
    keys: MutableMapping[EvalKeyId, EvalKey] | None = None,
    L: int | None = None,
    aliases: Mapping[str, str] | None = None,
    supplied: Mapping[str, Any] | None = None,
) -> PreparedCheck:
    """Draw random inputs per ``spec``, encrypt/encode them and bind the program's input image.

    ``supplied``: values to use instead of drawing them, by input name (a vector of N/2 slots or a
    real scalar, already checked by :mod:`caramel.userdata`); a supplied value whose scaled
    magnitude does not fit below half the modulus of its limbs is a :class:`CheckError`.

    Raises :class:`CheckError` when the spec's inputs or outputs do not match the manifest (names
    or kinds), and :class:`caramel.errors.BindingError` from binding.
    """
    if not isinstance(spec, CheckSpec):
        spec = load_check(spec)
    rng = rng_of(rng)
    secrets = secrets or Secrets.generate(ctx.n, rng)
    req = requirements(source, chip_manifests, aliases)
    manifest = _manifest_of(source)
    problems = fit_problems(spec, req)
    if problems:
        raise CheckError(f"{spec.path} does not fit {manifest.path}:\n  " + "\n  ".join(problems))

    L = default_limb_count(req) if L is None else int(L)
    try:
        env = _scale_env(ctx, L, spec.params)
    except ExprError as exc:
        raise CheckError(f"{spec.path}: params: {exc}") from None
    slots = ctx.n // 2
    values = DecodedInputs()
    objects: dict[str, Any] = {}
    encoded: dict[str, _Encoded | float] = {}  # per input in order: a vector's encoding, a scalar's value
    with ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="caramel-encode") as pool:
        for name, ins in spec.inputs.items():
            need = req.inputs[name]
            where = f"{spec.path}: inputs.{name}"
            try:
                scale = _number(evaluate(ins.scale, env), f"{where}.scale")
                limbs = (
                    need.limbs
                    if ins.limbs is None
                    else tuple(range(_limb_count(evaluate(ins.limbs, env), len(ctx.primes), f"{where}.limbs")))
                )
            except ExprError as exc:
                raise CheckError(f"{where}: {exc}") from None
            m = ins.magnitude
            given = None if supplied is None else supplied.get(name)
            if ins.kind == InputKind.SCALAR:
                c = float(rng.uniform(-m, m)) if given is None else _supplied_fits(where, given, scale, ctx, limbs)
                obj = encode_scalar(ctx, c, scale, limbs)
                encoded[name] = obj.value / scale
            else:
                if given is None:
                    v = rng.uniform(-m, m, slots)
                    if not ins.real:
                        v = v + 1j * rng.uniform(-m, m, slots)
                else:
                    v = _supplied_fits(where, given, scale, ctx, limbs)
                enc = encoded[name] = _Encoded(pool.submit(encode, v, scale, ctx.n), scale, limbs)
                obj = None  # a plaintext below; a ciphertext now (its encryption draws from rng, in input order)
                if ins.kind == InputKind.CIPHERTEXT:
                    obj = encrypt(ctx, secrets.s, enc.coeffs(), limbs, rng, scale)
            objects[name] = obj
        for name, enc in encoded.items():  # in input order
            if not isinstance(enc, _Encoded):
                values.put(name, enc)
                continue
            values.put_decoded(name, enc.coeffs(), enc.scale, ctx.n)
            if objects[name] is None:
                objects[name] = plaintext_from_coeffs(ctx, enc.coeffs(), enc.limbs, enc.scale)
    keys = {} if keys is None else keys
    memory = bind_inputs(
        source, ctx, secrets, objects, chip_manifests=chip_manifests, rng=rng, keys=keys, aliases=aliases
    )
    return PreparedCheck(spec, manifest, ctx, secrets, env, values, objects, memory, keys, aliases)


#: Threads that encode a run's vector inputs (NumPy's FFT and array work, mostly without the GIL)
#: while the caller draws and encrypts in input order (:func:`prepare_check`).
ENCODE_THREADS = max(1, min(4, cores.available()))


@dataclass(frozen=True)
class _Encoded:
    """A vector input being encoded (:func:`~caramel.ckks.encoding.encode` on a thread of
    :func:`prepare_check`), with its scale and limbs."""

    future: Future
    scale: float
    limbs: tuple[int, ...]

    def coeffs(self) -> np.ndarray:
        """The integer coefficients (waits for the encoding; re-raises its error)."""
        return self.future.result()


def _supplied_fits(where: str, value, scale: float, ctx, limbs) -> Any:
    """``value`` when max |value| * scale < Q / 2 (Q = the product of the primes of ``limbs``), else a
    :class:`CheckError`: the encoded integers would wrap modulo Q and decrypt to something else.
    (Every coefficient of encode(v) is at most max |v_j| * scale, so this bound suffices.)"""
    half = math.prod(int(ctx.primes[l]) for l in limbs) // 2
    with np.errstate(all="ignore"):
        mag = float(np.max(np.abs(np.asarray(value, dtype=np.complex128)))) * float(scale)
    if not math.isfinite(mag) or mag >= half:
        raise CheckError(f"{where}: the supplied value times its scale ({mag:.3g}) does not fit below half the "
                         f"modulus of its {len(limbs)} limb(s) ({half:.3g}); use smaller values or fewer bits of scale")
    return value


def _functions(slots: int, scale_out: float) -> dict[str, Callable[..., Any]]:
    def rot(v, k):
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if not isinstance(k, int) or isinstance(k, bool):
            raise ExprError(f"rot step must be an integer, got {k!r}")
        return rotate_slots(v, k) if isinstance(v, np.ndarray) and v.ndim == 1 else v

    def conj(v):
        return np.conj(v)

    def scaled(v, s):
        return v * s / scale_out

    return {"rot": rot, "conj": conj, "scaled": scaled}


def expected_output(prepared: PreparedCheck, name: str) -> tuple[np.ndarray, float, int | None]:
    """(expected slots, true output scale, modulus or None) of output ``name``."""
    out = prepared.spec.outputs[name]
    scale, modulus = output_scales(prepared.spec, prepared.ctx, prepared.env["L"])[name]
    slots = prepared.ctx.n // 2
    functions = _functions(slots, scale)
    env = ChainMap({}, prepared.values, prepared.env)  # lets go to the first map; inputs decoded when read
    for let, text in prepared.spec.lets.items():
        try:
            env[let] = evaluate(text, env, functions)
        except ExprError as exc:
            raise CheckError(f"{prepared.spec.path}: let.{let}: {exc}") from None
    try:
        value = evaluate(out.formula, env, functions)
    except ExprError as exc:
        raise CheckError(f"{prepared.spec.path}: outputs.{name}.formula: {exc}") from None
    try:
        value = np.broadcast_to(np.asarray(value, dtype=np.complex128), (slots,))
    except (TypeError, ValueError):
        raise CheckError(f"{prepared.spec.path}: outputs.{name}.formula does not give {slots} slots") from None
    return value, scale, modulus


def overflow_reason(scale: float, expected_max: float, modulus: int) -> str | None:
    """Why values up to ``expected_max`` at ``scale`` cannot decrypt correctly modulo ``modulus``:
    a centred coefficient holds at most modulus/2, and a slot of magnitude m at scale s needs
    about m * s of it (encoding keeps |coefficient| <= max slot magnitude * s). None when it fits."""
    need = expected_max * scale
    if not math.isfinite(need) or need <= 0:
        return None
    need_bits, room_bits = math.log2(need), math.log2(modulus) - 1
    if need_bits < room_bits:
        return None
    return (f"the expected values overflow the output modulus (scale x max|value| = 2^{need_bits:.1f} "
            f">= modulus/2 = 2^{room_bits:.1f}): no precision to report")


def _bits(err: float, ref: float) -> float:
    if not math.isfinite(err):
        return -math.inf
    return math.inf if err == 0 else -math.log2(err / ref)


def evaluate_check(prepared: PreparedCheck, memory: Mapping[Mem, np.ndarray], mode: Any = "exact") -> CheckReport:
    """Decrypt every output from ``memory`` (the union of the chips' stores over the input image)
    and compare it with its formula; see the module docstring for the measures."""
    ctx, spec = prepared.ctx, prepared.spec
    cts: Mapping[str, Ciphertext] = read_outputs(prepared.manifest, memory, aliases=prepared.aliases)
    results: dict[str, OutputResult] = {}
    mode = mode_name(mode)
    for name, out in spec.outputs.items():
        expected, scale, modulus = expected_output(prepared, name)
        ct = cts[name]
        sk = prepared.secrets.s if out.key == "s" else prepared.secrets.s_eph
        with np.errstate(all="ignore"):
            got = decrypt_values(ctx, sk, ct, scale, modulus)
            err = np.abs(got - expected)
        finite = bool(np.all(np.isfinite(err)))
        max_err = float(np.max(err)) if finite else math.inf
        med_err = float(np.median(err)) if finite else math.inf
        ref = max(1.0, float(np.max(np.abs(expected))))
        prec = _bits(max_err, ref)
        tol = out.tolerance(mode, ctx.n)
        q_out = modulus if modulus is not None else math.prod(int(ctx.primes[l]) for l in ct.limbs)
        overflow = overflow_reason(scale, float(np.max(np.abs(expected))), q_out)
        if overflow:
            results[name] = OutputResult(name, -math.inf, -math.inf, math.inf, math.inf, tol, False, scale, ct.limbs,
                                         overflow)
            continue
        results[name] = OutputResult(
            name, prec, _bits(med_err, ref), max_err, med_err, tol, None if tol is None else prec >= tol, scale, ct.limbs
        )
    return CheckReport(spec.path, mode, int(ctx.n), prepared.secrets.describe(), results)


def run_check(
    spec: CheckSpec | str | Path,
    source: Program | Manifest,
    ctx,
    execute: Callable[[dict[Mem, np.ndarray]], Mapping[Mem, np.ndarray]],
    *,
    mode: Any = "exact",
    secrets: Secrets | None = None,
    rng=None,
    chip_manifests: Sequence[Manifest] | None = None,
    keys: MutableMapping[EvalKeyId, EvalKey] | None = None,
    L: int | None = None,
    aliases: Mapping[str, str] | None = None,
) -> CheckReport:
    """Prepare inputs, run ``execute(memory_image) -> memory`` (the program's stores; the input image
    is laid under them, so aliased outputs are found) and judge the outputs."""
    prepared = prepare_check(
        spec, source, ctx, secrets=secrets, rng=rng, chip_manifests=chip_manifests, keys=keys, L=L, aliases=aliases
    )
    result = execute(dict(prepared.memory))
    return evaluate_check(prepared, {**prepared.memory, **dict(result)}, mode)
