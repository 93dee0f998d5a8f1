"""User data in and out: ``caramel run --inputs FILE`` and ``--save-outputs FILE``.

An inputs file gives one value per input name of the program's manifest (every input: a missing
or an unknown name is an error):

* ``.npz`` (read with ``allow_pickle=False``): one array per name. A ciphertext or plaintext input
  is a real or complex vector of N/2 slots, shape ``(N/2,)``, or ``(B, N/2)`` for a batch of B
  instances (entry i feeds instance i); a scalar input is a real number, shape ``()`` or ``(B,)``.
* ``.json``: an object ``{name: value}`` where a value is a number (scalar), a list of numbers
  (real vector), ``{"real": [...], "imag": [...]}`` (complex vector), or a list of those (a batch).

Every inputs file gets a bound before it is read (:func:`value_bound`): the values the program
can use at most (one vector of N/2 slots per input and instance). A file larger than those values
could be written in is refused from its size, and each ``.npz`` member from its header (dtype x
shape) before any of its data is decompressed; a JSON file nests at most :data:`JSON_DEPTH` levels
and its integers have at most 40 digits (:func:`caramel.infiles.parse_json`).

Values must be finite; they are encoded (and ciphertexts encrypted) at the scales and on the limbs
that the check file gives (or the default: scale 2^28 on the manifest's limbs), see
:func:`caramel.ckks.check.prepare_check`, which also refuses values whose scaled magnitude does not
fit the modulus. An unstacked value feeds every instance of a batch.

Outputs (:func:`save_outputs`): an ``.npz`` with, per output name, the decrypted slots (complex128,
shape ``(N/2,)``, or ``(B, N/2)`` for a batch) decoded at the output's true scale, which the check
file gives (``[outputs.NAME] scale``), and with ``limbs=True`` also ``<name>.c0`` and ``<name>.c1``
(uint32 ``(k, N)``, or ``(B, k, N)``, NTT form) and ``<name>.limbs`` (the limb indices). Without a
check file an output's scale is unknown (a product's is not its inputs'), so its slots are not
decoded: :func:`decrypted_outputs` raises :class:`OutputScaleError`, or with ``limbs=True`` gives
the limbs alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from caramel.ckks.bind import InputKind, read_outputs, requirements
from caramel.errors import CaramelError

#: Largest inputs file read without a program to bound it (:func:`load_inputs` with no ``max_values``).
MAX_BYTES = 4 << 30
#: Deepest nesting of an inputs JSON: {name: [ {"real": [...]} ]} (a batch of complex vectors).
JSON_DEPTH = 4
#: Bytes of JSON text one value can take at most ("-1.2345678901234567e-123, " in a complex pair).
_JSON_BYTES_PER_VALUE = 64
#: Bytes an inputs file holds beyond its values (names, headers, zip directory).
_SLACK = 64 << 10


class InputDataError(CaramelError):
    """An inputs file that cannot be read or does not fit the program."""


class OutputScaleError(CaramelError):
    """Outputs asked for as values whose scale is unknown (a run without a check file)."""


def scale_unknown_message(program_name: str) -> str:
    """Why the outputs of a run of ``program_name`` without a check file cannot be decoded."""
    return (f"the outputs of {program_name} cannot be decoded: without a check file their scale is unknown (a "
            "product's scale is not its inputs'), and decoding at a guessed scale gives wrong values; give "
            "--check CHECK.toml (check=... in Python) with each output's scale, or --save-limbs for the raw limbs")


@dataclass(frozen=True)
class InputData:
    """Values by input name, as loaded (``source``: the file, for messages)."""

    source: str
    arrays: Mapping[str, np.ndarray]


def _from_json_value(v: Any, where: str) -> np.ndarray:
    if isinstance(v, bool) or v is None:
        raise InputDataError(f"{where}: expected a number, a list of numbers or {{\"real\": [...], \"imag\": [...]}}")
    if isinstance(v, (int, float)):
        return np.asarray(float(v))
    if isinstance(v, dict):
        if set(v) - {"real", "imag"} or "real" not in v:
            raise InputDataError(f"{where}: a complex value is {{\"real\": [...], \"imag\": [...]}}, got keys {sorted(v)}")
        re = _from_json_value(v["real"], f"{where}.real")
        im = _from_json_value(v.get("imag", 0.0), f"{where}.imag")
        try:
            return re + 1j * im
        except ValueError:
            raise InputDataError(f"{where}: real part {re.shape} and imaginary part {im.shape} differ in shape") from None
    if isinstance(v, list):
        if v and all(isinstance(x, (list, dict)) for x in v):
            parts = [_from_json_value(x, f"{where}[{i}]") for i, x in enumerate(v)]
            if len({p.shape for p in parts}) != 1:
                raise InputDataError(f"{where}: the entries of a batch must all have the same length")
            return np.stack(parts)
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
            raise InputDataError(f"{where}: a vector is a list of numbers")
        return np.asarray(v, dtype=np.float64)
    raise InputDataError(f"{where}: unsupported value of type {type(v).__name__}")


def value_bound(program, slots: int, batch: int | None = None) -> int:
    """The most values an inputs file for ``program`` can hold: every input (scalar or vector) a
    vector of ``slots`` values, for each of ``batch`` instances (one without a batch)."""
    return max(1, len(requirements(program).inputs)) * slots * max(1, batch or 1)


def load_inputs(path: str | Path, max_values: int | None = None) -> InputData:
    """Read an inputs file (``.npz`` or ``.json``, see the module docstring); no code is executed.
    ``max_values``: the most values it may hold (:func:`value_bound`); the file is refused from its
    size, its ``.npz`` headers or its JSON text before more is read or allocated."""
    from caramel.infiles import BadData, NotRegularFile, TooLarge, npz_arrays, parse_json, read_bounded

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".json"):
        raise InputDataError(f"{path}: an inputs file is .npz or .json, not {suffix or 'without a suffix'}")
    per_value = 16 if suffix == ".npz" else _JSON_BYTES_PER_VALUE  # complex128; a number in text
    limit = MAX_BYTES if max_values is None else min(MAX_BYTES, max_values * per_value + _SLACK)
    try:
        data = read_bounded(path, limit)
    except FileNotFoundError:
        raise InputDataError(f"{path}: no such inputs file") from None
    except NotRegularFile as exc:
        raise InputDataError(f"{path}: not a regular file ({'a folder' if exc.is_dir else 'a device, FIFO or socket'})")
    except TooLarge as exc:
        raise InputDataError(f"{path}: {exc.size} bytes, larger than the {limit} bytes an inputs file of "
                             f"{'this program' if max_values else 'caramel'} can need; not an inputs file") from None
    except OSError as exc:
        raise InputDataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    arrays: dict[str, np.ndarray] = {}
    if suffix == ".npz":
        import io

        try:
            raw = npz_arrays(io.BytesIO(data), max_bytes=limit)
        except TooLarge as exc:
            raise InputDataError(f"{path}: {str(exc).split(': ', 1)[1]} (values larger than the inputs of this "
                                 f"program can be)") from None
        except BadData as exc:
            raise InputDataError(f"{path}: not a readable .npz of numeric arrays ({exc})") from None
        arrays = {name: _numeric(a, f"{path}: {name}") for name, a in raw.items()}
    else:
        try:
            doc = parse_json(data, max_depth=JSON_DEPTH)
        except BadData as exc:
            reason = str(exc)
            if reason.startswith("nested"):
                reason += " (an inputs file is {name: value}, a value a number, a list of numbers, {\"real\": [...], " \
                          "\"imag\": [...]} or a list of those)"
            raise InputDataError(f"{path}: {reason}") from None
        if not isinstance(doc, dict):
            raise InputDataError(f"{path}: expected a JSON object {{input name: value}}")
        arrays = {str(k): _from_json_value(v, f"{path}: {k}") for k, v in doc.items()}
    return InputData(str(path), arrays)


def _numeric(a: np.ndarray, where: str) -> np.ndarray:
    """``a`` as float64 (integers and reals) or complex128; :class:`InputDataError` for other dtypes."""
    if a.dtype.kind not in "iufc":
        raise InputDataError(f"{where}: expected real or complex numbers, got dtype {a.dtype}")
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def as_input_data(inputs: InputData | str | Path | Mapping[str, Any], max_values: int | None = None) -> InputData:
    """An :class:`InputData` from a file path (:func:`load_inputs`, bounded by ``max_values``) or a
    mapping ``{name: array-like}`` (the Python API)."""
    if isinstance(inputs, InputData):
        return inputs
    if isinstance(inputs, (str, Path)):
        return load_inputs(inputs, max_values)
    if not isinstance(inputs, Mapping):
        raise InputDataError(f"inputs must be a file path or a mapping of name to values, not {type(inputs).__name__}")
    arrays = {}
    for name, v in inputs.items():
        try:
            a = np.asarray(v)
        except (TypeError, ValueError) as exc:
            raise InputDataError(f"inputs: {name}: {exc}") from None
        arrays[str(name)] = _numeric(a, f"inputs: {name}")
    return InputData("<inputs>", arrays)


def check_inputs(data: InputData, program, slots: int, batch: int | None = None) -> int | None:
    """Check ``data`` against the manifest of ``program`` at ``slots`` = N/2 slots (names, kinds,
    shapes, finiteness); returns the number of stacked instances (None: nothing stacked). With
    ``batch``, stacked values must have exactly ``batch`` entries; without, at most one."""
    req = requirements(program)
    src = data.source
    problems = [f"input {n} ({need.kind}) is missing" for n, need in req.inputs.items() if n not in data.arrays]
    problems += [f"{n} is not an input of {program.name} (its inputs: {', '.join(sorted(req.inputs))})"
                 for n in data.arrays if n not in req.inputs]
    stacked: set[int] = set()
    for name, a in data.arrays.items():
        need = req.inputs.get(name)
        if need is None:
            continue
        if need.kind == InputKind.SCALAR:
            if a.ndim > 1:
                problems.append(f"{name} is a scalar input: expected a number or one number per instance, got shape {a.shape}")
                continue
            if a.dtype.kind == "c" and np.any(a.imag != 0):
                problems.append(f"{name} is a scalar input: it must be real")
            if a.ndim == 1:
                stacked.add(a.shape[0])
        else:
            if a.ndim not in (1, 2) or a.shape[-1] != slots:
                problems.append(f"{name} is a {need.kind} input: expected {slots} slots (N/2), shape ({slots},) "
                                f"or (B, {slots}), got shape {a.shape}")
                continue
            if a.ndim == 2:
                stacked.add(a.shape[0])
        if not np.all(np.isfinite(a)):
            bad = int(np.flatnonzero(~np.isfinite(a).reshape(-1))[0])
            problems.append(f"{name} has a non-finite value (NaN or infinity) at flat index {bad}")
    if len(stacked) > 1:
        problems.append(f"stacked inputs have different instance counts: {sorted(stacked)}")
    count = next(iter(stacked)) if len(stacked) == 1 else None
    if count is not None:
        if batch is None and count != 1:
            problems.append(f"the inputs hold {count} instances; run them with --batch {count}")
        elif batch is not None and count != batch:
            problems.append(f"the inputs hold {count} instances, the batch has {batch}")
    if problems:
        raise InputDataError(f"{src} does not fit {program.name}:\n  " + "\n  ".join(problems))
    return count


def instance_values(data: InputData, program, index: int) -> dict[str, Any]:
    """The values of instance ``index`` (checked data): entry ``index`` of stacked arrays, the
    value itself otherwise; scalars as Python floats, vectors as 1-D arrays."""
    req = requirements(program)
    out: dict[str, Any] = {}
    for name, a in data.arrays.items():
        scalar = req.inputs[name].kind == InputKind.SCALAR
        if scalar:
            v = a[index] if a.ndim == 1 else a
            out[name] = float(np.real(v))
        else:
            out[name] = a[index] if a.ndim == 2 else a
    return out


def decrypted_outputs(prepared, memory, *, limbs: bool = False) -> dict[str, np.ndarray]:
    """The program's outputs decrypted (slots, complex128) at the check's output scales, and with
    ``limbs`` the raw output ciphertexts (``<name>.c0``, ``<name>.c1``, ``<name>.limbs``)."""
    from caramel.ckks.check import output_scales
    from caramel.ckks.encrypt import decrypt_values

    cts = read_outputs(prepared.manifest, memory, aliases=prepared.aliases)
    known = getattr(prepared.spec, "scales_known", True)
    if not known and not limbs:
        raise OutputScaleError(scale_unknown_message(prepared.spec.path.removeprefix("<random inputs for ")
                                                     .removesuffix(">")))
    scales = output_scales(prepared.spec, prepared.ctx, prepared.env["L"]) if known else {}
    out: dict[str, np.ndarray] = {}
    for name, ct in cts.items():
        spec = prepared.spec.outputs.get(name)
        if name in scales:
            scale, modulus = scales[name]
            sk = prepared.secrets.s_eph if spec is not None and spec.key == "s_eph" else prepared.secrets.s
            with np.errstate(all="ignore"):
                out[name] = np.asarray(decrypt_values(prepared.ctx, sk, ct, scale, modulus), dtype=np.complex128)
        if limbs:
            out[f"{name}.c0"] = np.asarray(ct.c0, dtype=np.uint32)
            out[f"{name}.c1"] = np.asarray(ct.c1, dtype=np.uint32)
            out[f"{name}.limbs"] = np.asarray(ct.limbs, dtype=np.int64)
    return out


def stack_outputs(per_instance: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One array per key, stacked over instances (``.limbs`` entries are shared, not stacked)."""
    if len(per_instance) == 1:
        return dict(per_instance[0])
    keys = per_instance[0].keys()
    return {k: per_instance[0][k] if k.endswith(".limbs") else np.stack([o[k] for o in per_instance]) for k in keys}


def npz_writer(arrays: Mapping[str, np.ndarray]):
    """A function writing ``arrays`` as an ``.npz`` into an open binary file (no pickles)."""
    return lambda f: np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})


def save_outputs(path: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write ``arrays`` as an ``.npz`` atomically (:func:`caramel.outfiles.write_atomic`: a regular
    file only; an error names ``path``)."""
    from caramel.outfiles import Output, check_output, write_atomic

    check_output(Output("--save-outputs", str(path), stdout=False, suffixes=(".npz",)))
    return write_atomic(path, npz_writer(arrays), "--save-outputs")


__all__ = ["InputData", "InputDataError", "OutputScaleError", "as_input_data", "check_inputs", "decrypted_outputs", "instance_values",
           "load_inputs", "npz_writer", "save_outputs", "stack_outputs", "value_bound"]
