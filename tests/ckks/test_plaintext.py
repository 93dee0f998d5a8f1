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
