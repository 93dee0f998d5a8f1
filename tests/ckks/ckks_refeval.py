"""A tiny reference CKKS evaluator for the tests: exact big-integer rescale and keyswitching.

It is *not* the ISA interpreter: it computes what each catalog family means, homomorphically, with
the evaluation keys caramel.ckks generates (ModUp = centred CRT lift of a digit, ModDown and rescale
= exact rounding division), so that a check file, the key formulas and the binding can be validated
end to end without the interpreter.
"""

from __future__ import annotations

import numpy as np

from caramel.ckks import Ciphertext, Plaintext, Scalar, from_residues, to_ntt
from caramel.ckks.rns import mulmod, prime_column
from caramel.program import KeyType


class Ref:
    def __init__(self, ctx, keys):
        self.ctx, self.keys = ctx, keys

    # -- limb-wise arithmetic ------------------------------------------------------------------
    def _q(self, limbs):
        return prime_column(self.ctx, limbs)

    def add(self, a: Ciphertext, b: Ciphertext) -> Ciphertext:
        q = self._q(a.limbs)
        return Ciphertext(
            ((a.c0.astype(np.uint64) + b.c0) % q).astype(np.uint32),
            ((a.c1.astype(np.uint64) + b.c1) % q).astype(np.uint32),
            a.limbs,
        )

    def neg(self, a: Ciphertext) -> Ciphertext:
        q = self._q(a.limbs)
        return Ciphertext(((q - a.c0) % q).astype(np.uint32), ((q - a.c1) % q).astype(np.uint32), a.limbs)

    def sub(self, a, b):
        return self.add(a, self.neg(b))

    def times(self, a: Ciphertext, k: int) -> Ciphertext:
        q = self._q(a.limbs)
        kk = np.array([k % int(x) for x in q[:, 0]], dtype=np.uint64)[:, None]
        return Ciphertext(mulmod(a.c0, kk, q).astype(np.uint32), mulmod(a.c1, kk, q).astype(np.uint32), a.limbs)

    def add_plain(self, a: Ciphertext, p: Plaintext) -> Ciphertext:
        q = self._q(a.limbs)
        rows = np.stack([p.limb(l) for l in a.limbs]).astype(np.uint64)
        return Ciphertext(((a.c0 + rows) % q).astype(np.uint32), a.c1, a.limbs)

    def add_scalar(self, a: Ciphertext, s: Scalar) -> Ciphertext:
        q = self._q(a.limbs)
        r = np.array([s.limb(l) for l in a.limbs], dtype=np.uint64)[:, None]
        return Ciphertext(((a.c0 + r) % q).astype(np.uint32), a.c1, a.limbs)

    def mul_plain(self, a: Ciphertext, p: Plaintext) -> Ciphertext:
        q = self._q(a.limbs)
        rows = np.stack([p.limb(l) for l in a.limbs])
        return Ciphertext(mulmod(a.c0, rows, q).astype(np.uint32), mulmod(a.c1, rows, q).astype(np.uint32), a.limbs)

    def tensor(self, a: Ciphertext, b: Ciphertext):
        q = self._q(a.limbs)
        d0 = mulmod(a.c0, b.c0, q)
        d1 = (mulmod(a.c0, b.c1, q) + mulmod(a.c1, b.c0, q)) % q
        d2 = mulmod(a.c1, b.c1, q)
        return [d.astype(np.uint32) for d in (d0, d1, d2)], a.limbs

    # -- exact rescale and keyswitch ------------------------------------------------------------
    def _divide_round(self, rows, limbs, divisor: int, out_limbs):
        ctx = self.ctx
        x = from_residues(ctx.intt(rows, list(limbs)), ctx, limbs)
        y = (x + divisor // 2) // divisor
        return to_ntt(y, ctx, out_limbs)

    def rescale(self, a: Ciphertext) -> Ciphertext:
        top = a.limbs[-1]
        out = a.limbs[:-1]
        q = self.ctx.q(top)
        return Ciphertext(
            self._divide_round(a.c0, a.limbs, q, out), self._divide_round(a.c1, a.limbs, q, out), out
        )

    def key_ids(self, ktype, level, rot=None):
        ids = [k for k in self.keys if k.type == ktype and k.level == level and (rot is None or k.rot == rot)]
        assert ids, f"no key of type {ktype} at level {level} (rot {rot})"
        return ids

    def keyswitch(self, d, limbs, key_ids):
        """(ks0, ks1) on ``limbs`` with ks0 + ks1*s_old ~ d * s_new (exact ModUp/ModDown)."""
        ctx = self.ctx
        limbs = tuple(limbs)
        ext = key_ids[0].ext
        p_limbs = tuple(range(64 - ext, 64))
        all_limbs = limbs + p_limbs
        big_p = 1
        for l in p_limbs:
            big_p *= ctx.q(l)
        q = self._q(all_limbs)
        acc = [np.zeros((len(all_limbs), ctx.n), dtype=np.uint64) for _ in range(2)]
        coeff = ctx.intt(d, list(limbs))
        for kid in key_ids:
            key = self.keys[kid]
            rows = [limbs.index(l) for l in kid.digits]
            x = from_residues(coeff[rows], ctx, kid.digits)
            up = to_ntt(x, ctx, all_limbs)
            for h in range(2):
                kr = np.stack([key.limb(h, l) for l in all_limbs])
                acc[h] = (acc[h] + mulmod(up, kr, q)) % q
        return [self._divide_round(a.astype(np.uint32), all_limbs, big_p, limbs) for a in acc]

    def relin(self, d, limbs, key_ids) -> Ciphertext:
        d0, d1, d2 = d
        k0, k1 = self.keyswitch(d2, limbs, key_ids)
        q = self._q(limbs)
        return Ciphertext(((d0.astype(np.uint64) + k0) % q).astype(np.uint32), ((d1.astype(np.uint64) + k1) % q).astype(np.uint32), tuple(limbs))

    def mul_relin(self, a, b):
        d, limbs = self.tensor(a, b)
        return self.relin(d, limbs, self.key_ids(KeyType.RELIN, len(limbs)))

    def rotate(self, a: Ciphertext, k: int) -> Ciphertext:
        g = self.ctx.galois_element(k)
        r0, r1 = self.ctx.automorphism(a.c0, g), self.ctx.automorphism(a.c1, g)
        k0, k1 = self.keyswitch(r1, a.limbs, self.key_ids(KeyType.ROTATION, len(a.limbs), k))
        q = self._q(a.limbs)
        return Ciphertext(((r0.astype(np.uint64) + k0) % q).astype(np.uint32), k1, a.limbs)

    def mod_raise(self, a: Ciphertext) -> Ciphertext:
        """toEphemeral then ModRaise (ISA.md 5.5) with the manifest's type-4 and type-5 keys."""
        ctx = self.ctx
        limbs = a.limbs
        k0, k1 = self.keyswitch(a.c1, limbs, self.key_ids(KeyType.EPHEMERAL, len(limbs)))
        q = self._q(limbs)
        e0 = ((a.c0.astype(np.uint64) + k0) % q).astype(np.uint32)
        lifts = [ctx.crt(ctx.intt(c, list(limbs)), list(limbs)) for c in (e0, k1)]  # unsigned, [0, Q3)
        (kid,) = [k for k in self.keys if k.type == KeyType.BOOTSTRAP2]
        r = kid.level - 1
        raised = tuple(range(r + 1))
        ks = self.keyswitch(to_ntt(lifts[1], ctx, raised), raised, [kid])
        out = self.rescale(Ciphertext(ks[0], ks[1], raised))
        x0 = to_ntt(lifts[0], ctx, out.limbs).astype(np.uint64)
        qo = self._q(out.limbs)
        return Ciphertext(((out.c0 + x0) % qo).astype(np.uint32), out.c1, out.limbs)


def run_family(family: str, ref: Ref, objs: dict, out_names) -> dict:
    """The output ciphertexts of one catalog family, computed homomorphically."""
    o = objs
    if family == "Add":
        z = ref.add(o["x"], ref.times(o["y"], 2))
    elif family == "AddScalar":
        z = ref.times(ref.add_scalar(ref.neg(o["x"]), o["s"]), 2)
    elif family == "PtSub":
        z = ref.add_plain(ref.neg(o["y"]), o["x"])
    elif family == "PtMul":
        z = ref.times(ref.mul_plain(o["x"], o["y"]), 2)
    elif family == "Rotate":
        z = ref.rotate(o["x"], -2)
    elif family == "RotMulAdd":
        z = ref.rotate(o["x"], -1)
    elif family in ("Rescale", "Relin"):
        z = ref.rescale(o["x"])
    elif family in ("Mul", "MulRescale"):
        z = ref.rescale(ref.mul_relin(o["x"], o["y"]))
    elif family == "MulRotate":
        z = ref.rescale(ref.rotate(ref.mul_relin(o["x"], o["y"]), 2))
    elif family == "MulAdd":
        d, limbs = ref.tensor(o["x"], o["y"])
        q = ref._q(limbs)
        d = [(x.astype(np.uint64) * 2 % q).astype(np.uint32) for x in d]
        z = ref.relin(d, limbs, ref.key_ids(KeyType.RELIN, len(limbs)))
        z = ref.rescale(ref.add_plain(z, o["a"]))
    elif family == "MulAdd2":
        xy = ref.mul_relin(o["x"], o["y"])
        d, limbs = ref.tensor(o["x"], o["y"])
        q = ref._q(limbs)
        d = [((d[0].astype(np.uint64) + xy.c0) % q).astype(np.uint32), ((d[1].astype(np.uint64) + xy.c1) % q).astype(np.uint32), d[2]]
        z = ref.rescale(ref.relin(d, limbs, ref.key_ids(KeyType.RELIN, len(limbs))))
    elif family == "Relin2":
        d, limbs = ref.tensor(o["x"], o["y"])
        z = ref.relin(d, limbs, ref.key_ids(KeyType.RELIN, len(limbs)))
    elif family == "PtMulRescale":
        z = ref.rescale(ref.mul_plain(o["x"], o["y"]))
    elif family == "ModSwitchPt":
        z = ref.mul_plain(o["x"], o["p"])
    elif family == "PolyX8":
        z = o["x"]
        for _ in range(3):
            z = ref.rescale(ref.mul_relin(z, z))
    elif family == "BootstrapModRaise":
        z = ref.mod_raise(o["xx"])
    else:
        raise KeyError(family)
    (name,) = out_names
    return {name: z}
