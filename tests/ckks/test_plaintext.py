"""The limbs a user gives to encrypt, encode a plaintext or a scalar (caramel.ckks.plaintext.checked_limbs):
at least one, distinct integers; anything else is an ArgumentError (limbs=[] used to encrypt to
nothing and decrypt to 0)."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks.encrypt import decrypt_values, encrypt_values
from caramel.ckks.keys import Secrets
from caramel.ckks.plaintext import encode_plaintext, encode_scalar
from caramel.errors import ArgumentError
from caramel.ring import Context

N = 64
CTX = Context(n=N)
SECRETS = Secrets.generate(N, np.random.default_rng(1))
VALUES = np.full(N // 2, 0.5)

MAKERS = {
    "encrypt_values": lambda limbs: encrypt_values(CTX, SECRETS.s, VALUES, 2.0**20, limbs, np.random.default_rng(2)),
    "encode_plaintext": lambda limbs: encode_plaintext(CTX, VALUES, 2.0**20, limbs),
    "encode_scalar": lambda limbs: encode_scalar(CTX, 0.5, 2.0**20, limbs),
}


@pytest.mark.parametrize("maker", MAKERS, ids=list(MAKERS))
@pytest.mark.parametrize("limbs,message", [([], "limbs is empty"), ([0, 0], "name a limb twice"),
                                           ([0.5], "integer limb indices"), ([True], "integer limb indices"),
                                           (3, "sequence of limb indices"), ([64], "outside")])
def test_bad_limbs_are_refused(maker, limbs, message):
    with pytest.raises(ArgumentError, match=message):
        MAKERS[maker](limbs)


def test_good_limbs_round_trip():
    ct = MAKERS["encrypt_values"](np.array([0, 2], dtype=np.int64))
    assert ct.limbs == (0, 2)
    assert np.allclose(decrypt_values(CTX, SECRETS.s, ct), VALUES, atol=1e-3)


def test_a_plans_tuple_is_its_own_answer_and_other_limbs_are_normalised():
    from caramel.ckks.plaintext import checked_limbs

    plan = (0, 3, 5)
    assert checked_limbs(plan) is plan
    assert checked_limbs([np.int64(3), 0]) == (3, 0) and all(type(l) is int for l in checked_limbs((np.int64(2),)))
    for bad, message in (((True,), "integer limb indices"), ((1, 1), "name a limb twice"), ((), "limbs is empty")):
        with pytest.raises(ArgumentError, match=message):
            checked_limbs(bad)


def test_round_product_is_the_exact_product_rounded_half_to_even():
    from fractions import Fraction

    from caramel.ckks.plaintext import round_product

    rng = np.random.default_rng(7)
    xs = list(rng.uniform(-1, 1, 300) * 10.0 ** rng.integers(-12, 6, 300))
    xs += [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0, 2.0**-40, 1e300, -1e-300]
    scales = [2.0**28, 2.0**40 * 1.000001, 3.0, 1, 2**70, np.float64(2.0**20), Fraction(7, 3), 1e-3]
    for x in xs:
        for s in scales:
            assert round_product(float(x), s) == round(Fraction(float(x)) * Fraction(s)), (x, s)


@pytest.mark.parametrize("value,scale", [(0.375, 2.0**28), (-0.375, 2.0**28), (-1.0, 2.0**61), (3.25, 2.0**70),
                                         (-3.25, 2.0**70), (1e-9, 2.0**20)])
def test_scalar_residues_are_the_rounded_value_mod_each_prime(value, scale):
    from fractions import Fraction

    limbs = (0, 5, 63)
    sc = encode_scalar(CTX, value, scale, limbs)
    v = round(Fraction(value) * Fraction(scale))
    assert sc.value == v and sc.residues.dtype == np.uint32
    assert list(sc.residues) == [v % CTX.q(l) for l in limbs]
