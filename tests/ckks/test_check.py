"""Check files: format, fit with every catalog program, and end-to-end runs with a reference evaluator."""

from __future__ import annotations

import math
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from caramel.ckks import (
    CHECKS_DIR,
    Ciphertext,
    input_mems,
    CheckError,
    check_path,
    evaluate_check,
    family_of,
    fit_problems,
    load_check,
    output_scales,
    parse_check,
    prepare_check,
    requirements,
    run_check,
    write_outputs,
)
from caramel.ckks.bind import read_outputs
from caramel.ckks.check import (
    CheckSpec, InputSpec, OutputSpec, default_limb_count, expected_output, resolve_tolerance,
)
from caramel import load_program, run_program
from caramel.ring import Context
from caramel.program import Mem
from caramel.ring import Mode

from ckks_helpers import PROGRAMS, context, load, load_manifest
from ckks_refeval import Ref, run_family
from tests.conftest import read_at_once

FAMILIES = [
    "Add", "AddScalar", "PtSub", "PtMul", "Rotate", "RotMulAdd", "Rescale", "Relin", "Mul", "MulRescale",
    "MulRotate", "MulAdd", "MulAdd2", "Relin2", "PtMulRescale", "ModSwitchPt", "PolyX8", "BootstrapModRaise",
]
N = 4096


def _catalog_programs():
    if not PROGRAMS.exists():
        return []
    return sorted(p.name for p in PROGRAMS.iterdir() if (p / "program_inputs").exists() and family_of(p.name) != "BootstrapLike")


@pytest.mark.parametrize("family", FAMILIES, ids=[f"checkfile/{f}" for f in FAMILIES])
def test_check_file_loads(family):
    spec = load_check(CHECKS_DIR / f"{family}.toml")
    assert spec.outputs and spec.inputs and spec.description
    for out in spec.outputs.values():
        for mode in ("exact", "textbook"):
            for n in (1024, 4096, 65536):
                assert out.tolerance(mode, n) is not None


def test_every_catalog_program_fits_its_check():
    """Each family's check file matches every L and chip count: input names/kinds, outputs, scales."""
    names = _catalog_programs()
    if not names:
        pytest.skip("no compiled programs")
    ctx = context(N)
    seen = set()
    for name in names:
        man = load_manifest(name)
        spec = load_check(check_path(name))
        req = requirements(man)
        assert not req.problems, name
        assert fit_problems(spec, req) == [], name
        L = default_limb_count(req)
        for scale, modulus in output_scales(spec, ctx, L).values():
            assert math.isfinite(scale) and scale > 0
            assert modulus is None or modulus > 2**80
        seen.add(family_of(name))
    assert seen == set(FAMILIES)


def _prepared(name, rng, **kw):
    prog = load(name)
    ctx = context(N)
    return prog, prepare_check(check_path(name), prog, ctx, rng=rng, **kw)


def _run(prog, prep, family=None, mode="exact"):
    outs = run_family(family or family_of(prog.name), Ref(prep.ctx, prep.keys), prep.objects, list(prep.spec.outputs))
    return evaluate_check(prep, {**prep.memory, **write_outputs(prog, outs)}, mode)


E2E = [f"{f}_4L_1c" for f in FAMILIES] + [f"{f}_10L_2c" for f in FAMILIES] + [
    "Rotate_51L_4c", "Mul_51L_8c", "BootstrapModRaise_51L_2c", "PolyX8_51L_1c",
]


@pytest.mark.parametrize("name", E2E, ids=[f"check-e2e/{n}" for n in E2E])
def test_reference_run_passes(name, rng):
    """The family's meaning computed homomorphically with caramel's keys decrypts to the formula."""
    prog, prep = _prepared(name, rng)
    report = _run(prog, prep)
    assert report.passed, report.summary()
    for r in report.results.values():
        assert r.passed is True and r.precision_bits > 12 and r.median_bits >= r.precision_bits


def test_wrong_results_fail(rng):
    prog, prep = _prepared("Rotate_4L_1c", rng)
    right = Ref(prep.ctx, prep.keys).rotate(prep.objects["x"], -2)
    wrong = type(right)(right.c0, prep.objects["x"].c1, right.limbs)  # a corrupted c1
    assert evaluate_check(prep, {**prep.memory, **write_outputs(prog, {"z": right})}).passed
    report = evaluate_check(prep, {**prep.memory, **write_outputs(prog, {"z": wrong})})
    assert not report.passed and report.results["z"].passed is False


def test_bootstrap_needs_the_modulus(rng):
    prog, prep = _prepared("BootstrapModRaise_4L_1c", rng)
    outs = run_family("BootstrapModRaise", Ref(prep.ctx, prep.keys), prep.objects, ["z"])
    memory = {**prep.memory, **write_outputs(prog, outs)}
    assert evaluate_check(prep, memory).passed
    data = tomllib.loads((CHECKS_DIR / "BootstrapModRaise.toml").read_text())
    del data["outputs"]["z"]["modulus"]
    prep.spec = parse_check(data, "no-modulus")
    report = evaluate_check(prep, memory)
    assert report.results["z"].passed is False


def _ciphertexts_from_image(prog, image):
    """Rebuild the input ciphertexts from a memory image (what an executor sees)."""
    req = requirements(prog)
    rows = {}
    for term, src in req.terms.items():
        if src.kind is not None and src.kind.value == "ciphertext":
            for l in req.term_limbs[term]:
                rows.setdefault(src.name, {}).setdefault(src.part, {})[l] = image[Mem(term, l)]
    out = {}
    for name, parts in rows.items():
        limbs = tuple(sorted(parts["c0"]))
        out[name] = Ciphertext(np.stack([parts["c0"][l] for l in limbs]), np.stack([parts["c1"][l] for l in limbs]), limbs)
    return out


def test_run_check_with_executor_and_mode_enum(rng):
    prog = load("MulRotate_4L_2c")
    ctx = context(N)
    keys = {}
    seen = {}

    def execute(image):
        seen["image"] = set(image)
        objs = _ciphertexts_from_image(prog, image)
        return write_outputs(prog, run_family("MulRotate", Ref(ctx, keys), objs, ["z"]))

    report = run_check(check_path("MulRotate_4L_2c"), prog, ctx, execute, mode=Mode.TEXTBOOK, rng=rng, keys=keys)
    assert seen["image"] == input_mems(prog)
    assert report.mode == "textbook" and report.passed, report.summary()
    assert "dense-ternary" in report.summary() and "sparse-ternary(h=32)" in report.summary()


def test_tolerance_tables():
    tol = {"exact": 10, "textbook": {"1024": 10, "4096": 9, "65536": 4}}
    assert resolve_tolerance(tol, "exact", 65536) == 10
    assert resolve_tolerance(tol, "textbook", 512) == 10
    assert resolve_tolerance(tol, "textbook", 2048) == 9
    assert resolve_tolerance(tol, "textbook", 8192) == 4
    assert resolve_tolerance(tol, "textbook", 131072) == 4
    assert resolve_tolerance(tol, "emulator", 1024) is None
    assert resolve_tolerance({**tol, "default": 3}, "emulator", 1024) == 3
    assert resolve_tolerance(7, "anything", 1) == 7


def _doc(**outputs):
    return {
        "inputs": {"x": {"kind": "ciphertext", "scale": "S"}},
        "outputs": {"z": {"formula": "x", "scale": "S", "tolerance_bits": 10, **outputs}},
    }


BAD_DOCS = [
    ({"formula": "x.real"}, "Attribute"),
    ({"formula": "y"}, "not declared"),
    ({"formula": "eval(x)"}, "call"),
    ({"scale": "x"}, "not declared"),  # inputs are not scale variables
    ({"tolerance_bits": {"fast": 3}}, "unknown mode"),
    ({"tolerance_bits": {"exact": {"big": 3}}}, "unknown key 'big'"),
    ({"tolerance_bits": {"exact": {"1000": 3}}}, "unknown key '1000'"),
    ({"tolerance_bits": "ten"}, "positive finite"),
    # tolerances are positive finite numbers of bits
    ({"tolerance_bits": 0}, "positive finite"),
    ({"tolerance_bits": -3}, "positive finite"),
    ({"tolerance_bits": float("nan")}, "positive finite"),
    ({"tolerance_bits": float("inf")}, "positive finite"),
    ({"tolerance_bits": True}, "positive finite"),
    ({"tolerance_bits": {"exact": float("nan")}}, "positive finite"),
    ({"tolerance_bits": {"textbook": {"1024": -1}}}, "positive finite"),
    # a ring dimension in ASCII digits only: "²" and "١٠٢٤" pass str.isdigit (the first ended in a traceback)
    ({"tolerance_bits": {"exact": {"\u00b2": 3}}}, "unknown key '\u00b2'"),
    ({"tolerance_bits": {"exact": {"\u0661\u0660\u0662\u0664": 3}}}, "unknown key"),
    ({"tolerance_bits": {"exact": {"1024\n": 3}}}, "unknown key"),
    # memory bounds: no sequence repetition
    ({"scale": "S * (q * 10**9)[0]"}, "Subscript|sequence|subscripted"),
    ({"key": "s2"}, "key must be"),
    ({"colour": "red"}, "unknown keys"),
]


@pytest.mark.parametrize("extra,why", BAD_DOCS, ids=[f"checkfile-reject/{i}" for i in range(len(BAD_DOCS))])
def test_parse_check_rejects(extra, why):
    with pytest.raises(CheckError, match=why):
        parse_check(_doc(**extra))


def test_parse_check_structure_errors():
    with pytest.raises(CheckError, match="kind"):
        parse_check({"inputs": {"x": {"kind": "cipher", "scale": "S"}}, "outputs": {"z": {"formula": "1", "scale": "S"}}})
    with pytest.raises(CheckError, match="reserved"):
        parse_check({"inputs": {"q": {"kind": "ciphertext", "scale": "S"}}, "outputs": {"z": {"formula": "1", "scale": "S"}}})
    with pytest.raises(CheckError, match="no \\[outputs"):
        parse_check({"inputs": {}})
    with pytest.raises(CheckError, match="unknown top-level"):
        parse_check({**_doc(), "extra": 1})
    spec = parse_check({"params": {"T": "S**2", "U": "T / q[0]"}, **_doc(scale="U", formula="scaled(rot(conj(x), -3), T)")})
    assert spec.params == {"T": "S**2", "U": "T / q[0]"}


def test_check_must_fit_the_manifest(rng):
    prog = load("Mul_4L_1c")
    spec = parse_check({
        "inputs": {"x": {"kind": "plaintext", "scale": "S"}, "w": {"kind": "ciphertext", "scale": "S"}},
        "outputs": {"z": {"formula": "x", "scale": "S"}},
    })
    with pytest.raises(CheckError) as exc:
        prepare_check(spec, prog, context(N), rng=rng)
    msg = str(exc.value)
    assert "manifest input y" in msg and "x is a ciphertext in the manifest" in msg and "declared input w" in msg


def test_prepared_values_are_the_decoded_messages(rng):
    prog, prep = _prepared("AddScalar_4L_2c", rng)
    s = prep.values["s"]
    assert isinstance(s, float) and abs(s * 2**28 - round(s * 2**28)) < 1e-6
    assert prep.values["x"].shape == (N // 2,)
    ct = read_outputs(prog, {**prep.memory, **write_outputs(prog, {"z": prep.objects["x"]})})["z"]
    assert ct.limbs == (0, 1, 2, 3)


def test_decoded_inputs_are_decoded_when_first_read(rng, monkeypatch):
    """A vector input's message is decoded on first use, once, with the bits of decode(encode(v));
    an unjudged output's formula ("0") decodes none."""
    from caramel.ckks import check as checkmod
    from caramel.ckks.encoding import decode

    calls = []
    monkeypatch.setattr(checkmod, "decode", lambda *a: calls.append(a) or decode(*a))
    prog, prep = _prepared("AddScalar_4L_2c", rng)
    assert set(prep.values) == {"x", "s"} and len(prep.values) == 2 and not calls
    x = prep.values["x"]
    assert len(calls) == 1 and prep.values["x"] is x
    assert np.array_equal(x, decode(*calls[0]))
    unjudged = CheckSpec("<0>", "", {}, prep.spec.inputs, {"z": OutputSpec("z", "0", "S")})
    calls.clear()
    _, prep = _prepared("AddScalar_4L_2c", rng)
    prep.spec = unjudged
    value, _, _ = expected_output(prep, "z")
    assert not calls and not np.any(value)


# --- issue 12 / 17: bounded check files, readable errors, expressiveness -------------------------

MUL_1C = Path(__file__).resolve().parents[2] / "programs" / "Mul_4L_1c"

def _write(tmp_path, data: bytes, name: str = "c.toml"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


GOOD_TOML = b'''
[inputs.x]
kind = "ciphertext"
scale = "S"
[outputs.z]
formula = "x"
scale = "S"
tolerance_bits = 10
'''


def test_load_check_refuses_invalid_utf8_with_file_and_reason(tmp_path):
    p = _write(tmp_path, GOOD_TOML.replace(b'"x"', b'"x\xff\xfe"'))
    with pytest.raises(CheckError, match=r"c\.toml: not UTF-8"):
        load_check(p)


@pytest.mark.parametrize("opener", ["[", "{ a = "])
def test_load_check_refuses_deep_nesting(tmp_path, opener):
    closer = "]" if opener == "[" else "}"
    deep = "v = " + opener * 5000 + "1" + closer * 5000 + "\n"
    with pytest.raises(CheckError, match=r"c\.toml: .*nested"):
        load_check(_write(tmp_path, deep.encode() + GOOD_TOML))


def test_load_check_refuses_what_is_not_a_small_regular_file(tmp_path):
    with pytest.raises(CheckError, match="not a regular file"):
        load_check(tmp_path)
    with pytest.raises(CheckError, match="not a regular file"):
        load_check("/dev/zero")
    import os
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(CheckError, match="not a regular file"):
        load_check(fifo)
    with pytest.raises(CheckError, match="at most"):
        load_check(_write(tmp_path, GOOD_TOML + b"#" * (2 << 20)))


def test_limbs_beyond_the_primes_are_refused_before_any_allocation():
    prog = load_program(MUL_1C)
    spec = load_check(check_path("Mul"))
    for bad in ("10**9", "65", "N"):
        ins = dict(spec.inputs)
        ins["x"] = InputSpec("x", ins["x"].kind, "S", bad)
        doc = CheckSpec(spec.path, "", {}, ins, spec.outputs)
        with pytest.raises(CheckError, match="beyond the context's 64 primes"):
            prepare_check(doc, prog, Context(n=1024), rng=0)


def test_overflowing_output_scale_says_so_instead_of_a_precision():
    prog = load_program(MUL_1C)
    spec = load_check(check_path("Mul"))
    outs = dict(spec.outputs)
    outs["z"] = OutputSpec("z", "x * y * 2**80", outs["z"].scale, tolerance_bits=10)
    doc = CheckSpec(spec.path, "", spec.params, spec.inputs, outs)
    report = run_program(prog, n=1024, backend="cpu", check=doc).report
    result = report.results["z"]
    assert result.passed is False and result.overflow and "overflow the output modulus" in str(result)
    assert "precision" not in str(result).split("overflow")[0]


def test_lets_sum_and_products_express_a_rotation_sum(tmp_path):
    """The same rotation-sum expected value written three ways: lets level by level, a sum over a
    range, and the slot sum (all slots equal the sum after log2(slots) levels)."""
    ctx = Context(n=64)
    x = np.arange(32.0) + 1j
    env_values = {"x": x}
    forms = {
        "lets": {"let": {"a1": "x + rot(x, 1)", "a2": "a1 + rot(a1, 2)", "a3": "a2 + rot(a2, 4)",
                         "a4": "a3 + rot(a3, 8)", "a5": "a4 + rot(a4, 16)"}, "formula": "a5"},
        "range": {"formula": "sum(rot(x, i) for i in range(slots))"},
        "slot sum": {"formula": "sum(x)"},
    }
    for what, form in forms.items():
        doc = {"inputs": {"x": {"kind": "ciphertext", "scale": "S"}}, "let": form.get("let", {}),
               "outputs": {"z": {"formula": form["formula"], "scale": "S**2 / prod(q[L-i] for i in range(1, 2))",
                                 "tolerance_bits": 10}}}
        spec = parse_check(doc, what)
        assert spec.lets == form.get("let", {})

        class Prepared:  # the fields expected_output reads
            pass

        prepared = Prepared()
        prepared.spec, prepared.ctx = spec, ctx
        prepared.env = {"S": 2**28, "q": tuple(int(p) for p in ctx.primes), "N": 64, "slots": 32, "L": 3}
        prepared.values = env_values
        value, scale, _ = expected_output(prepared, "z")
        assert np.allclose(value, np.full(32, x.sum())), what
        assert scale == pytest.approx(2**56 / int(ctx.primes[2]))


def test_lets_are_checked_like_formulas():
    base = {"inputs": {"x": {"kind": "ciphertext", "scale": "S"}},
            "outputs": {"z": {"formula": "a", "scale": "S", "tolerance_bits": 10}}}
    with pytest.raises(CheckError, match="let.a"):
        parse_check({**base, "let": {"a": "x.real"}})
    with pytest.raises(CheckError, match="already declared"):
        parse_check({**base, "let": {"x": "x"}})
    with pytest.raises(CheckError, match="reserved"):
        parse_check({**base, "let": {"sum": "x"}})
    with pytest.raises(CheckError, match="not declared"):
        parse_check({**base, "let": {"a": "b", "b": "x"}})  # in order: b is not yet declared
    with pytest.raises(CheckError, match="more than"):
        parse_check({**base, "let": {f"a{i}": "x" for i in range(300)} | {"a": "x"}})


def test_a_check_file_with_a_non_ascii_tolerance_key_is_a_clean_cli_error(tmp_path, capsys):
    from caramel.cli import main

    check = tmp_path / "c.toml"
    check.write_text('[inputs.x]\nkind = "ciphertext"\nscale = "S"\n[inputs.y]\nkind = "ciphertext"\nscale = "S"\n'
                     '[outputs.z]\nformula = "x * y"\nscale = "S**2 / q[L-1]"\ntolerance_bits = { exact = { "\u00b2" = 3 } }\n',
                     encoding="utf-8")
    program = Path(__file__).resolve().parents[2] / "programs" / "Mul_4L_1c"
    assert main(["run", str(program), "--n", "256", "--backend", "cpu", "--check", str(check), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("caramel: error:") and "unknown key" in err and "Traceback" not in err


def test_decoded_inputs_read_by_two_threads_at_once(monkeypatch):
    """Two threads read a pending input of one DecodedInputs at once (the checks of two instances submitted with the
    same ready inputs): both get its decoded value, computed once; the second waits for the first's decode rather
    than reading the placeholder (None) the first has not yet replaced."""
    import caramel.ckks.check as check_module

    calls = []

    def slow_decode(coeffs, scale, n):
        calls.append(n)
        time.sleep(0.2)
        return np.full(n // 2, 0.5)

    monkeypatch.setattr(check_module, "decode", slow_decode)
    values = check_module.DecodedInputs()
    values.put_decoded("x", np.zeros(16, dtype=np.int64), 2.0**20, 16)
    got = read_at_once(values, "x")
    assert calls == [16] and len(got) == 2 and all(g is not None and np.array_equal(g, np.full(8, 0.5)) for g in got)
