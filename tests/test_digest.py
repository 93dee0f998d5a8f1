"""The output digest names outputs by their position in the manifest, not by term names."""

from __future__ import annotations

import dataclasses

import caramel
from caramel.api import output_digest
from caramel.program import Mem

from tests.conftest import REPO


def test_digest_ignores_the_compilers_term_names():
    program = caramel.load_program(REPO / "programs" / "Mul_4L_2c")
    outcome = caramel.run_program(program, n=1024, backend="cpu", check=None)
    rename = {e.term: f"renamed_{i}" for i, e in enumerate(program.manifest.outputs)}
    manifest = dataclasses.replace(program.manifest, entries=tuple(
        dataclasses.replace(e, term=rename[e.term]) if e in program.manifest.outputs else e
        for e in program.manifest.entries))
    renamed = dataclasses.replace(program, manifest=manifest)
    memory = {Mem(rename.get(k.term, k.term), k.limb): v for k, v in outcome.result.memory.items()}
    assert output_digest(renamed, memory) == outcome.digest


def test_digest_sees_one_changed_residue():
    program = caramel.load_program(REPO / "programs" / "Mul_4L_2c")
    outcome = caramel.run_program(program, n=1024, backend="cpu", check=None)
    entry = program.manifest.outputs[0]
    key = Mem(entry.term, entry.limbs[0])
    memory = dict(outcome.result.memory)
    memory[key] = memory[key].copy()
    memory[key][7] ^= 1
    assert output_digest(program, memory) != outcome.digest


def test_one_two_and_four_chip_compilations_print_one_digest():
    digests = {caramel.run_program(caramel.load_program(REPO / "programs" / f"Mul_4L_{c}c"), n=1024,
                                   backend="cpu", seed=3).digest for c in (1, 2, 4)}
    assert len(digests) == 1
