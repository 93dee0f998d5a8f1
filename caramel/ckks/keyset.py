"""Key material of one run, drawn apart from its inputs.

A run has two independent random streams, both from NumPy's ``default_rng`` with a two-word seed:

* key material (secrets, then every evaluation key the program names, in the order of
  :func:`caramel.ckks.bind.requirements`): ``default_rng([key_seed, KEY_STREAM])``;
* inputs (values, encodings, encryption randomness): ``default_rng([seed, INPUT_STREAM])``.

So one :class:`KeySet` serves many runs (a key store, the instances of a batch), and a run with
``seed=s, key_seed=k`` is the same whether its keys were generated now, loaded from a store made
with seed ``k``, or shared by a batch whose key seed is ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from caramel.ckks.bind import requirements
from caramel.ckks.keys import EvalKey, Secrets, generate_evalkeys
from caramel.program import EvalKeyId, Manifest, Program

#: Second seed word of the key-material stream.
KEY_STREAM = 0x6B6579
#: Second seed word of the input stream.
INPUT_STREAM = 0x696E70


def key_rng(key_seed: int) -> np.random.Generator:
    """The generator of key material for ``key_seed``."""
    return np.random.default_rng([int(key_seed), KEY_STREAM])


def input_rng(seed: int) -> np.random.Generator:
    """The generator of inputs (values and encryption randomness) for ``seed``."""
    return np.random.default_rng([int(seed), INPUT_STREAM])


@dataclass(frozen=True, eq=False)
class KeySet:
    """The secrets and the evaluation keys of a run (``keys`` maps every key id to its key)."""

    secrets: Secrets
    keys: Mapping[EvalKeyId, EvalKey] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"KeySet({len(self.keys)} evaluation keys, secrets {self.secrets.describe()})"


def generate_keyset(
    source: Program | Manifest,
    ctx,
    key_seed: int,
    *,
    chip_manifests: Sequence[Manifest] | None = None,
    aliases: Mapping[str, str] | None = None,
    device=None,
    background: bool = False,
    on_device: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> KeySet:
    """Secrets and every evaluation key ``source`` needs, all drawn from :func:`key_rng`.

    ``device`` ("cpu", "gpu" or a :class:`caramel.ckks.arith.ClientArith`; default the current
    client device) is where the products and transforms run; the keys are the same bit for bit.
    ``background``: on a GPU, the keys are copied back by a host thread while the caller goes on
    (``keys`` is then a :class:`~caramel.ckks.keys.PendingKeys`); ``on_device``: on a GPU, the keys stay
    there (CuPy arrays) for a GPU executor (:func:`caramel.ckks.keys.generate_evalkeys`).
    ``progress(done, total)``: called as the keys are made (on a GPU: queued)."""
    rng = key_rng(key_seed)
    secrets = Secrets.generate(ctx.n, rng)
    req = requirements(source, chip_manifests, aliases)
    ids = req.keys if progress is None else _counted(list(req.keys), progress)
    return KeySet(secrets, generate_evalkeys(ctx, ids, secrets, rng, device, background=background,
                                             on_device=on_device))


def _counted(items: list, progress: Callable[[int, int], None]) -> Iterator:
    """``items`` one by one, calling ``progress(done, total)`` when the consumer asks for the next
    (so item i is counted once the consumer has finished with it) and at the end."""
    for i, item in enumerate(items):
        yield item
        progress(i + 1, len(items))
