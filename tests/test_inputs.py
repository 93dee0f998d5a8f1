"""User data in and out (:mod:`caramel.userdata`, ``prepare_check(supplied=)``, ``caramel run --inputs
FILE --save-outputs FILE``): the user's values are the ones encrypted, decrypted outputs match the
formula, and bad files give clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from caramel.api import run_program
from caramel.batch import run_batch
from caramel.ckks.check import CheckError
from caramel.cli import main
from caramel.outfiles import OutputError
from caramel.parse import load_program
from caramel.userdata import InputDataError, check_inputs, decrypted_outputs, load_inputs, save_outputs

from tests.conftest import REPO, SHARED_PROGRAMS

ADD = REPO / "programs" / "Add_4L_1c"
ROT = REPO / "programs" / "MulRotate_4L_1c"
N = 1024
SLOTS = N // 2


@pytest.fixture(scope="module")
def add():
    return load_program(ADD, progress=False)


@pytest.fixture(scope="module")
def rot():
    return load_program(ROT, progress=False)


def vectors(seed: int = 3, count: int | None = None):
    rng = np.random.default_rng(seed)
    shape = (SLOTS,) if count is None else (count, SLOTS)
    x = rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)
    y = rng.uniform(-1, 1, shape)
    return x, y


def test_supplied_values_are_encrypted_and_decrypt_to_the_formula(rot):
    x, y = vectors()
    outcome = run_program(rot, n=N, backend="cpu", inputs={"x": x, "y": y})
    assert outcome.report.passed
    assert np.allclose(outcome.prepared.values["x"], x, atol=1e-6)
    assert np.allclose(outcome.prepared.values["y"], y, atol=1e-6)
    z = decrypted_outputs(outcome.prepared, outcome.result.memory)["z"]
    assert z.shape == (SLOTS,) and np.allclose(z, np.roll(x * y, -2), atol=1e-3)
    assert outcome.digest != run_program(rot, n=N, backend="cpu").digest


def test_inputs_from_npz_and_json_agree(rot, tmp_path):
    x, y = vectors()
    npz = tmp_path / "in.npz"
    np.savez(npz, x=x, y=y)
    js = tmp_path / "in.json"
    js.write_text(json.dumps({"x": {"real": x.real.tolist(), "imag": x.imag.tolist()}, "y": y.tolist()}))
    a = run_program(rot, n=N, backend="cpu", inputs=npz)
    b = run_program(rot, n=N, backend="cpu", inputs=js)
    assert a.digest == b.digest and a.report.passed


@pytest.mark.skipif(not (SHARED_PROGRAMS / "AddScalar_4L_1c").is_dir(), reason="AddScalar_4L_1c not in the corpus")
def test_scalar_inputs(tmp_path):
    program = load_program(SHARED_PROGRAMS / "AddScalar_4L_1c", progress=False)
    x, _ = vectors()
    outcome = run_program(program, n=N, backend="cpu", inputs={"x": x, "s": 0.25})
    assert outcome.report.passed
    assert outcome.prepared.values["s"] == pytest.approx(0.25)
    z = decrypted_outputs(outcome.prepared, outcome.result.memory)["z"]
    assert np.allclose(z, 2 * (0.25 - x), atol=1e-4)
    with pytest.raises(InputDataError, match="scalar input: it must be real"):
        run_program(program, n=N, backend="cpu", inputs={"x": x, "s": 1 + 1j})


@pytest.mark.skipif(not (SHARED_PROGRAMS / "PtMul_4L_1c").is_dir(), reason="PtMul_4L_1c not in the corpus")
def test_plaintext_inputs():
    from caramel.ckks.bind import InputKind, requirements

    program = load_program(SHARED_PROGRAMS / "PtMul_4L_1c", progress=False)
    req = requirements(program)
    assert InputKind.PLAINTEXT in {need.kind for need in req.inputs.values()}
    data = {name: vectors(seed=k)[1] * 0.5 for k, name in enumerate(req.inputs)}
    outcome = run_program(program, n=N, backend="cpu", inputs=data)
    assert outcome.report.passed
    for name, v in data.items():
        assert np.allclose(outcome.prepared.values[name], v, atol=1e-6)


@pytest.mark.parametrize(("data", "message"), [
    ({"x": vectors()[0]}, r"input y \(ciphertext\) is missing"),
    ({"x": vectors()[0], "y": vectors()[1], "w": vectors()[1]}, "w is not an input"),
    ({"x": vectors()[0][:100], "y": vectors()[1]}, "expected 512 slots"),
    ({"x": np.full(SLOTS, np.nan), "y": vectors()[1]}, "non-finite"),
    ({"x": vectors(count=3)[0], "y": vectors()[1]}, "run them with --batch 3"),
    ({"x": np.array(["a"] * SLOTS), "y": vectors()[1]}, "expected real or complex numbers"),
])
def test_bad_inputs_are_clear_errors(rot, data, message):
    with pytest.raises(InputDataError, match=message):
        run_program(rot, n=N, backend="cpu", inputs=data)


def test_values_that_do_not_fit_the_modulus(rot):
    x, y = vectors()
    with pytest.raises(CheckError, match="does not fit below half the modulus"):
        run_program(rot, n=N, backend="cpu", inputs={"x": x * 1e60, "y": y})


@pytest.mark.parametrize(("name", "text", "message"), [
    ("a.json", "[1, 2]", "expected a JSON object"),
    ("a.json", "{nope", "not valid JSON"),
    ("a.json", '{"x": [true]}', "a vector is a list of numbers"),
    ("a.json", '{"x": {"re": [1]}}', "complex value is"),
    ("a.npz", "not a zip", "not a readable .npz"),
    ("a.txt", "x", "an inputs file is .npz or .json"),
])
def test_unreadable_files(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputDataError, match=message):
        load_inputs(path)


def test_npz_with_objects_is_refused(tmp_path):
    path = tmp_path / "o.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputDataError, match="holds Python objects"):
        load_inputs(path)


def test_batch_takes_entry_i_and_broadcasts_unstacked(rot):
    x, _ = vectors(count=3)
    _, y = vectors(seed=9)
    result = run_batch(rot, n=N, backend="cpu-plan", batch=3, inputs={"x": x, "y": y}, outputs=True)
    assert all(r["passed"] for r in result.records)
    for i, inst in enumerate(result.instances):
        assert np.allclose(inst.outputs["z"], np.roll(x[i] * y, -2), atol=1e-3)
        single = run_program(rot, n=N, backend="cpu", seed=i, key_seed=0, inputs={"x": x[i], "y": y})
        assert single.digest == inst.digest
    with pytest.raises(InputDataError, match="the batch has 4"):
        run_batch(rot, n=N, backend="cpu-plan", batch=4, inputs={"x": x, "y": y})


def test_check_inputs_counts_instances(rot):
    from caramel.userdata import as_input_data

    x, y = vectors(count=2)
    assert check_inputs(as_input_data({"x": x, "y": y}), rot, SLOTS, batch=2) == 2
    assert check_inputs(as_input_data({"x": x[0], "y": y[0]}), rot, SLOTS) is None


def test_cli_inputs_and_save_outputs(rot, tmp_path, capsys):
    x, y = vectors()
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inp, x=x, y=y)
    code = main(["run", str(ROT), "--n", str(N), "--backend", "cpu", "-q", "--inputs", str(inp),
                 "--save-outputs", str(out), "--save-limbs"])
    text = capsys.readouterr().out
    assert code == 0 and "PASS" in text and "decrypt" in text
    with np.load(out, allow_pickle=False) as data:
        assert set(data.files) == {"z", "z.c0", "z.c1", "z.limbs"}
        assert np.allclose(data["z"], np.roll(x * y, -2), atol=1e-3)
        assert data["z.c0"].dtype == np.uint32 and data["z.c0"].shape == (len(data["z.limbs"]), N)


def test_cli_input_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": [1, 2, 3]}')
    assert main(["run", str(ROT), "--n", str(N), "--backend", "cpu", "-q", "--inputs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "caramel: error:" in err and "bad.json" in err and "expected 512 slots" in err and "y (ciphertext) is missing" in err
    assert main(["run", str(ROT), "--n", str(N), "--backend", "cpu", "-q", "--save-limbs"]) == 2


def test_save_outputs_is_atomic_and_refuses_links(tmp_path):
    target = tmp_path / "elsewhere.npz"
    target.write_bytes(b"keep")
    link = tmp_path / "out.npz"
    link.symlink_to(target)
    with pytest.raises(OutputError, match="symbolic link"):
        save_outputs(link, {"z": np.zeros(4)})
    assert target.read_bytes() == b"keep"
    with pytest.raises(OutputError, match=r"must end in \.npz"):
        save_outputs(tmp_path / "out.txt", {"z": np.zeros(4)})
    path = save_outputs(tmp_path / "ok.npz", {"z": np.arange(4.0)})
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with np.load(path) as data:
        assert list(data["z"]) == [0, 1, 2, 3]


# Every inputs file gets a bound before it is read: what the program can use at most.

from tests.test_infiles import declaring, zip_bomb  # noqa: E402


@pytest.mark.parametrize("make", [lambda p: declaring(p, 10**10), lambda p: zip_bomb(p, 20 << 20)],
                         ids=["header-declares-1e10-values", "zip-bomb"])
def test_an_npz_beyond_what_the_program_can_use_is_refused_from_its_headers(rot, tmp_path, make):
    """A file of a few KiB declaring 10^10 values (80 GB) or deflating to 160 MiB: refused from its
    headers, nothing allocated (each input of this program has N/2 slots)."""
    path = make(tmp_path / "in.npz")
    with pytest.raises(InputDataError, match="larger than"):
        run_program(rot, n=N, backend="cpu", inputs=path)


@pytest.mark.parametrize("text,message", [
    ('{"x": ' + "[" * 20000 + "]" * 20000 + "}", "nested more than"),
    ('{"x": [' + "9" * 4000 + "]}", "integer of 4000 digits"),
    ('{"x": ' + "[" * 5 + "1" + "]" * 5 + "}", "nested more than 4 levels"),
    ('{"x": [1e999' + ", 0" * (SLOTS - 1) + '], "y": [' + ", ".join(["0"] * SLOTS) + "]}", "non-finite"),
])
def test_hostile_json_inputs_are_clear_errors(rot, tmp_path, text, message):
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(InputDataError, match=message):
        run_program(rot, n=N, backend="cpu", inputs=path)


def test_an_inputs_file_larger_than_the_program_can_use_is_refused_before_reading(rot, tmp_path):
    path = tmp_path / "in.json"
    with open(path, "wb") as f:
        f.truncate(5 << 30)
    with pytest.raises(InputDataError, match="larger than"):
        run_program(rot, n=N, backend="cpu", inputs=path)


def test_cli_hostile_inputs_exit_2_without_a_traceback(tmp_path, capsys):
    path = declaring(tmp_path / "in.npz", 10**10)
    assert main(["run", str(ROT), "--n", str(N), "--backend", "cpu", "-q", "--inputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("caramel: error:") and "Traceback" not in err and str(path) in err


# Outputs are decoded at their true scale, or not at all.

MUL1 = REPO / "programs" / "Mul_4L_1c"


def test_saved_outputs_are_at_the_true_scale(tmp_path, capsys):
    """0.5 x 0.5 saved as 0.25 (the check file says the output's scale: S^2 / q[L-1])."""
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"x": [0.5] * SLOTS, "y": [0.5] * SLOTS}))
    out = tmp_path / "o.npz"
    assert main(["run", str(MUL1), "--n", str(N), "--backend", "cpu", "-q", "--inputs", str(path), "--save-outputs",
                 str(out)]) == 0
    with np.load(out) as data:
        assert np.allclose(data["z"], 0.25, atol=1e-3)


@pytest.mark.parametrize("how", [["--no-check"], ["--check", "none"]])
def test_without_a_check_file_outputs_are_not_decoded_at_a_guessed_scale(tmp_path, capsys, monkeypatch, how):
    """Without a check file the output's scale is unknown: --save-outputs is refused before the run
    (it saved 0.5 x 0.5 as 0.3228, decoded at 2^28), --save-limbs saves the limbs alone."""
    import caramel.cli as cli

    if how[-1] == "none":  # a family without a check file
        monkeypatch.setattr("caramel.instance.check_path", lambda name: tmp_path / "absent.toml")
        how = []
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"x": [0.5] * SLOTS, "y": [0.5] * SLOTS}))
    out = tmp_path / "o.npz"
    base = ["run", str(MUL1), "--n", str(N), "--backend", "cpu", "-q", "--inputs", str(path), *how]
    assert main([*base, "--save-outputs", str(out)]) == 2
    assert "scale is unknown" in capsys.readouterr().err and not out.exists()
    assert main([*base, "--save-outputs", str(out), "--save-limbs"]) == 0
    assert "limbs alone" in capsys.readouterr().out
    with np.load(out) as data:
        assert sorted(data.files) == ["z.c0", "z.c1", "z.limbs"]


def test_the_api_refuses_to_decode_outputs_of_unknown_scale():
    from caramel.userdata import OutputScaleError

    program = load_program(MUL1, progress=False)
    outcome = run_program(program, n=N, backend="cpu", check=None)
    with pytest.raises(OutputScaleError, match="scale is unknown"):
        decrypted_outputs(outcome.prepared, outcome.result.memory)
    assert set(decrypted_outputs(outcome.prepared, outcome.result.memory, limbs=True)) == {"z.c0", "z.c1", "z.limbs"}
