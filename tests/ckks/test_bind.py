"""Binding values and keys to real manifests; reading outputs back, ISA.md 8.6 aliasing."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks import (
    InputKind,
    Secrets,
    bind_inputs,
    decrypt_values,
    encode_plaintext,
    encode_scalar,
    encrypt_values,
    input_mems,
    read_outputs,
    requirements,
    write_outputs,
)
from caramel.ckks.rns import prime_column
from caramel.errors import BindingError
from caramel.program import EvalKeyId, KeyType, Manifest, ManifestEntry, Mem, Section, Symbol

from ckks_helpers import context, load

N = 4096


def _inputs(ctx, req, sec, rng):
    vals = {}
    for name, need in req.inputs.items():
        z = rng.uniform(-1, 1, ctx.n // 2)
        if need.kind == InputKind.CIPHERTEXT:
            vals[name] = encrypt_values(ctx, sec.s, z, 2.0**28, need.limbs, rng)
        elif need.kind == InputKind.PLAINTEXT:
            vals[name] = encode_plaintext(ctx, z, 2.0**28, need.limbs)
        else:
            vals[name] = encode_scalar(ctx, 0.25, 2.0**28, need.limbs)
    return vals


PROGS = ["Mul_4L_1c", "MulRotate_10L_4c", "BootstrapModRaise_4L_2c", "AddScalar_4L_2c", "MulAdd_10L_8c", "Relin2_4L_2c"]


@pytest.mark.parametrize("name", PROGS, ids=[f"bind/{p}" for p in PROGS])
def test_binding_covers_every_mem(name, rng):
    prog = load(name)
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    req = requirements(prog)
    assert not req.problems
    keys = {}
    memory = bind_inputs(prog, ctx, sec, _inputs(ctx, req, sec, rng), rng=rng, keys=keys)
    want = input_mems(prog)
    assert set(memory) == want
    # the per-chip manifests name nothing the global one lacks, here
    assert want == {Mem(e.term, l) for e in prog.manifest.inputs for l in e.limbs}
    assert set(keys) == set(req.keys)
    for mem, arr in memory.items():
        assert arr.dtype == np.uint32 and not arr.flags.writeable
        assert arr.shape == (() if mem.term.startswith("s") else (N,)), mem
        if arr.shape:
            assert int(arr.max()) < ctx.q(mem.limb)
    # one logical key per id: every term naming it reads the same data
    for e in prog.manifest.section(Section.EVALKEY):
        key = keys[e.symbol.key]
        for l in e.limbs:
            assert np.shares_memory(memory[Mem(e.term, l)], key.limb(e.symbol.part, l))


def test_requirements_of_real_manifests():
    req = requirements(load("BootstrapModRaise_4L_2c"))
    assert req.kinds() == {"xx": InputKind.CIPHERTEXT}
    assert req.inputs["xx"].limbs == (0, 1, 2) and req.inputs["xx"].parts == ("c0", "c1")
    assert {k.type for k in req.keys} == {KeyType.EPHEMERAL, KeyType.BOOTSTRAP2}
    assert EvalKeyId(KeyType.BOOTSTRAP2, 5, 3, 4, (0, 1, 2, 3, 4)) in req.keys
    assert len(req.keys) == 4 and list(req.outputs) == ["z"]
    assert req.outputs["z"].limbs == (0, 1, 2, 3)
    req = requirements(load("MulAdd_4L_1c"))
    assert req.kinds() == {"x": "ciphertext", "y": "ciphertext", "a": "plaintext"}
    assert req.names("plaintext") == ("a",)
    assert requirements(load("AddScalar_4L_1c")).kinds()["s"] == InputKind.SCALAR


def test_missing_inputs_are_all_listed(rng):
    prog = load("MulAdd_4L_1c")
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    with pytest.raises(BindingError) as exc:
        bind_inputs(prog, ctx, sec, {}, rng=rng)
    assert exc.value.missing == ["a", "x", "y"]
    assert "missing inputs: a, x, y" in str(exc.value)


def test_wrong_kind_and_missing_limbs_reported_together(rng):
    prog = load("MulAdd_4L_1c")
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    z = np.zeros(N // 2)
    vals = {
        "x": encode_plaintext(ctx, z, 2.0**28, range(4)),  # wrong kind
        "y": encrypt_values(ctx, sec.s, z, 2.0**28, range(2), rng),  # too few limbs
    }
    with pytest.raises(BindingError) as exc:
        bind_inputs(prog, ctx, sec, vals, rng=rng)
    msg = str(exc.value)
    assert "missing inputs: a" in msg and "input x must be a ciphertext" in msg and "y lacks limbs [2, 3]" in msg
    with pytest.raises(BindingError, match="secrets are needed"):
        bind_inputs(prog, ctx, None, {**vals, "x": vals["y"]}, rng=rng)


def test_read_outputs_round_trip_and_missing(rng):
    prog = load("Mul_4L_2c")
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    z = rng.uniform(-1, 1, N // 2)
    ct = encrypt_values(ctx, sec.s, z, 2.0**28, range(3), rng)
    mem = write_outputs(prog, {"z": ct})
    assert set(mem) == {Mem(e.term, l) for e in prog.manifest.outputs for l in e.limbs}
    out = read_outputs(prog, mem)
    assert out["z"].limbs == (0, 1, 2) and out["z"].scale is None
    assert np.max(np.abs(decrypt_values(ctx, sec.s, out["z"], 2.0**28) - z)) < 2**-14
    del mem[Mem("v35", 1)]
    del mem[Mem("v37", 2)]
    with pytest.raises(BindingError) as exc:
        read_outputs(prog, mem)
    assert "z:c1 limb 1" in str(exc.value) and "z:c0 limb 2" in str(exc.value)


def _aliased_manifest(with_partner: bool = True) -> Manifest:
    e = ManifestEntry
    ents = [
        e(Section.CIPHERTEXT, "i2", Symbol("w", "c1"), (0, 1, 2), 3),
        e(Section.SCALAR, "s3", Symbol("s", "s"), (0, 1, 2), 8),
        e(Section.OUTPUT, "v4", Symbol("w", "c0"), (0, 1, 2), 11),
    ]
    if with_partner:
        ents.insert(0, e(Section.CIPHERTEXT, "i1", Symbol("x", "c0"), (0, 1, 2), 2))
    return Manifest("aliased/program_inputs", tuple(ents))


def test_output_aliasing_an_input_term(rng):
    """ISA.md 8.6: Output('w', x + s) keeps x.c1; the manifest renames i2 to w:c1."""
    man = _aliased_manifest()
    req = requirements(man)
    assert req.kinds() == {"x": "ciphertext", "s": "scalar"}
    assert req.aliased == {"i2": ("w", "c1")}
    assert req.outputs["w"].terms == {"c0": ("v4",), "c1": ("i2",)}
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    x = rng.uniform(-1, 1, N // 2)
    cx = encrypt_values(ctx, sec.s, x, 2.0**28, range(3), rng)
    sc = encode_scalar(ctx, 0.5, 2.0**28, range(3))
    image = bind_inputs(man, ctx, sec, {"x": cx, "s": sc})
    assert np.array_equal(image[Mem("i2", 1)], cx.c1[1])
    q = prime_column(ctx, range(3))
    c0 = (cx.c0.astype(np.uint64) + sc.residues.astype(np.uint64)[:, None]) % q
    stores = {Mem("v4", l): c0[l].astype(np.uint32) for l in range(3)}
    w = read_outputs(man, {**image, **stores})["w"]
    assert np.array_equal(w.c1, cx.c1)
    assert np.max(np.abs(decrypt_values(ctx, sec.s, w, 2.0**28) - (x + 0.5))) < 2**-14
    # explicit aliases work without the partner term; without either it is an error
    lone = _aliased_manifest(with_partner=False)
    with pytest.raises(BindingError, match="aliases="):
        bind_inputs(lone, ctx, sec, {"x": cx, "s": sc})
    image = bind_inputs(lone, ctx, sec, {"x": cx, "s": sc}, aliases={"i2": "x:c1"})
    assert set(image) == {Mem("i2", l) for l in range(3)} | {Mem("s3", l) for l in range(3)}


def test_shared_key_cache_across_programs(rng):
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    keys = {}
    for name in ("Mul_4L_1c", "MulRescale_4L_2c"):
        prog = load(name)
        req = requirements(prog)
        bind_inputs(prog, ctx, sec, _inputs(ctx, req, sec, rng), rng=rng, keys=keys)
    assert len(keys) == 1  # both name K:0:4:4:0:[0,1,2,3]


class _DeviceRows:
    """Stands for GPU rows kept by the GPU client: ``__cuda_array_interface__``, ``get()``, row
    indexing, no implicit conversion to NumPy."""

    def __init__(self, a):
        self._a = np.asarray(a)
        self.dtype, self.shape, self.ndim = self._a.dtype, self._a.shape, self._a.ndim
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def __getitem__(self, i):
        return _DeviceRows(self._a[i])

    def get(self):
        return self._a.copy()

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a device array")


def test_inputs_kept_on_the_device_are_bound_as_they_are_and_read_back(rng, monkeypatch):
    """A ciphertext whose rows stay on the GPU (caramel.ckks.device.keeping_inputs) is bound without a
    copy; an output aliasing it is read back to host arrays (transfer.download faked)."""
    from caramel.backends.cuda import transfer
    from caramel.ckks import Ciphertext

    monkeypatch.setattr(transfer, "download", lambda a: a.get())
    man = _aliased_manifest()
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    cx = encrypt_values(ctx, sec.s, rng.uniform(-1, 1, N // 2), 2.0**28, range(3), rng)
    kept = Ciphertext(_DeviceRows(cx.c0), _DeviceRows(cx.c1), cx.limbs, cx.scale)
    sc = encode_scalar(ctx, 0.5, 2.0**28, range(3))
    image = bind_inputs(man, ctx, sec, {"x": kept, "s": sc})
    assert isinstance(image[Mem("i2", 1)], _DeviceRows) and isinstance(image[Mem("s3", 1)], np.ndarray)
    stores = {Mem("v4", l): cx.c0[l] for l in range(3)}
    w = read_outputs(man, {**image, **stores})["w"]
    assert isinstance(w.c1, np.ndarray) and np.array_equal(w.c1, cx.c1)
