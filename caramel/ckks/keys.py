"""Secret keys and evaluation keys (ISA.md decision 5 and section 5.3).

Secrets. The client holds two ternary secrets with *explicit* distributions, recorded next to every
accuracy figure (:meth:`Secrets.describe`):

* s, the main secret: dense ternary by default (each coefficient uniform in {-1, 0, 1}), optionally
  sparse ternary with Hamming weight h;
* s_eph, the ephemeral secret used around bootstrapping: sparse ternary, h = 32 by default.

A :class:`SecretKey` stores the small integer coefficients and caches their NTT form per limb.

Evaluation keys (ISA.md 5.3). A key id ``EvalKeyId(type, level, ext=E, rot, digits=D)`` names one
logical key with limbs {0..level-1} U {64-E..63}, NTT form. With P = prod_{i<E} q_{63-i}, ``a``
uniform and ``e`` one centred-binomial error polynomial (CBD(21), sigma ~ 3.2) reduced into every limb:

    c1_l = a_l
    c0_l = -a_l * s_old + e + [l in D] * [P mod q_l] * s_new        (mod q_l)

so that c0 + c1 * s_old = e + [l in D] * P * s_new on every limb. (s_old, s_new) by type:

    RELIN        (s, s^2)              ROTATION step k   (s, s(X^g)), g = 5^(k mod N/2) mod 2N
    CONJUGATION  (s, s(X^(2N-1)))      EPHEMERAL         (s_eph, s)
    BOOTSTRAP    (s, q_{level-1} * s)  BOOTSTRAP2        (s, q_{level-1} * s_eph)

s(X^g) is computed in NTT form with ``ctx.automorphism`` (the same permutation the interpreter's
``rot``/``con`` apply). If level + E > 64 the Q and P index ranges overlap (ISA.md 8.7); the key then
has one row per distinct limb and, on a shared limb l, P mod q_l = 0 removes the s_new term.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from caramel.ckks import device as devmod
from caramel.ckks.arith import HOST, ClientArith
from caramel.ckks.sampling import PcgState, dense_ternary, rng_of, sparse_ternary, uniform_residues
from caramel.program import EvalKeyId, KeyType
from caramel.errors import ArgumentError, MissingLimbError

#: Index of the last prime; extension primes count down from here (ISA.md 5.1).
TOP_LIMB = 63


@dataclass(frozen=True, slots=True)
class SecretDist:
    """Ternary secret distribution: dense (``hamming_weight=None``) or sparse with weight h."""

    hamming_weight: int | None = None

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.hamming_weight is None:
            return dense_ternary(n, rng)
        return sparse_ternary(n, self.hamming_weight, rng)

    def __str__(self) -> str:
        return "dense-ternary" if self.hamming_weight is None else f"sparse-ternary(h={self.hamming_weight})"


#: Default distribution of the main secret s.
DENSE_TERNARY = SecretDist()
#: Default distribution of the ephemeral secret s_eph.
EPHEMERAL_DEFAULT = SecretDist(hamming_weight=32)


def sparse(h: int) -> SecretDist:
    """Sparse ternary distribution with Hamming weight h."""
    return SecretDist(hamming_weight=int(h))


@dataclass(eq=False)
class SecretKey:
    """A ternary secret polynomial: ``coeffs`` (N,) int64 in {-1,0,1}, its distribution, NTT cache."""

    coeffs: np.ndarray
    dist: SecretDist = DENSE_TERNARY
    _ntt: dict = field(default_factory=dict, repr=False)
    _ctx: object = field(default=None, repr=False)

    @classmethod
    def generate(cls, n: int, rng=None, dist: SecretDist = DENSE_TERNARY) -> "SecretKey":
        return cls(dist.sample(n, rng_of(rng)), dist)

    @property
    def n(self) -> int:
        return int(self.coeffs.shape[0])

    def ntt(self, ctx, limb: int) -> np.ndarray:
        """NTT form of s on limb ``limb``, (N,) uint32, cached per context and limb (read-only)."""
        if ctx.n != self.n:
            raise ArgumentError(f"secret has N = {self.n}, context has N = {ctx.n}")
        if self._ctx is not ctx:
            self._ntt.clear()
            self._ctx = ctx
        limb = int(limb)
        if limb not in self._ntt:
            row = devmod.to_ntt(self.coeffs, ctx, [limb])[0]
            row.setflags(write=False)
            self._ntt[limb] = row
        return self._ntt[limb]

    def ntt_limbs(self, ctx, limbs) -> np.ndarray:
        """NTT form of s on every limb of ``limbs``, shape (len(limbs), N) uint32."""
        return np.stack([self.ntt(ctx, l) for l in limbs])


@dataclass(frozen=True, eq=False)
class Secrets:
    """The client's secrets: main ``s`` and ephemeral ``s_eph``."""

    s: SecretKey
    s_eph: SecretKey

    @classmethod
    def generate(
        cls, n: int, rng=None, dist: SecretDist = DENSE_TERNARY, eph_dist: SecretDist = EPHEMERAL_DEFAULT
    ) -> "Secrets":
        rng = rng_of(rng)
        return cls(SecretKey.generate(n, rng, dist), SecretKey.generate(n, rng, eph_dist))

    def describe(self) -> dict[str, str]:
        """The distributions, to record with accuracy figures: ``{"s": ..., "s_eph": ...}``."""
        return {"s": str(self.s.dist), "s_eph": str(self.s_eph.dist)}


@dataclass(frozen=True, eq=False)
class EvalKey:
    """One logical evaluation key: rows ``c0[r]``, ``c1[r]`` belong to limb ``limbs[r]`` (NTT form).

    ``a_state``: the key generator's PCG64 state before it drew ``c1 = a`` (None when unknown or not
    PCG64), from which :func:`redraw_a` draws ``c1`` again bit for bit (a key store keeps it instead
    of ``c1``'s limbs)."""

    key_id: EvalKeyId
    limbs: tuple[int, ...]
    c0: np.ndarray
    c1: np.ndarray
    a_state: PcgState | None = None

    def limb(self, half: int | str, limb: int) -> np.ndarray:
        """Half ``half`` (0/1 or "c0"/"c1") on limb ``limb``: (N,) uint32."""
        h = {0: 0, 1: 1, "c0": 0, "c1": 1}.get(half)
        if h is None:
            raise ArgumentError(f"key half must be 0, 1, 'c0' or 'c1', got {half!r}")
        try:
            r = self.limbs.index(int(limb))
        except ValueError:
            raise MissingLimbError(f"key {self.key_id} has no limb {limb} (limbs {list(self.limbs)})") from None
        return (self.c0, self.c1)[h][r]


class PendingKeys(Mapping):
    """Evaluation keys whose halves arrive in the background: ``futures[2i]``, ``futures[2i+1]`` give
    c0 and c1 of key ``ids[i]`` (files of a key store read by threads,
    :func:`caramel.ckks.keystore.load_keys`; keys made on a GPU copied back by a thread,
    :func:`generate_evalkeys`). The key ids are known at once (``in``, ``len``, iteration do not
    wait); a key's value waits for its two halves and raises what producing them raised (a damaged
    file's :class:`~caramel.ckks.keystore.KeyStoreError`). :meth:`wait` waits for every key.
    ``states``: each key's ``a_state`` (:class:`EvalKey`), or None."""

    def __init__(self, ids: list[tuple[EvalKeyId, tuple[int, ...]]], futures: list,
                 states: list[PcgState | None] | None = None):
        self._ids = {kid: i for i, (kid, _) in enumerate(ids)}
        self._limbs = [limbs for _, limbs in ids]
        self._futures = futures
        self._states = states if states is not None else [None] * len(ids)
        self._done: dict[EvalKeyId, EvalKey] = {}

    def __getitem__(self, kid: EvalKeyId) -> EvalKey:
        got = self._done.get(kid)
        if got is None:
            i = self._ids[kid]  # KeyError for a key the store does not hold
            got = self._done[kid] = EvalKey(kid, self._limbs[i], self._futures[2 * i].result(),
                                            self._futures[2 * i + 1].result(), self._states[i])
        return got

    def __iter__(self):
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, kid) -> bool:
        return kid in self._ids

    def wait(self) -> None:
        """Wait for every key's files; raise the :class:`KeyStoreError` of the first damaged one."""
        for kid in self._ids:
            self[kid]


def key_limbs(key_id: EvalKeyId) -> tuple[int, ...]:
    """Distinct limbs of a key in ascending order: {0..level-1} U {64-E..63}."""
    return tuple(sorted(set(key_id.limbs())))


def extension_modulus(ctx, ext: int) -> int:
    """P = prod_{i<E} q_{63-i}."""
    p = 1
    for i in range(ext):
        p *= ctx.q(TOP_LIMB - i)
    return p


def key_secrets(ctx, key_id: EvalKeyId, secrets: Secrets, limbs) -> tuple[np.ndarray, np.ndarray]:
    """(s_old, s_new) in NTT form on ``limbs``, each (len(limbs), N) uint32, per the table above (on
    the host)."""
    _check_key_id(key_id, key_limbs(key_id))
    old, new, perm = key_secret_rows(ctx, key_id, secrets, list(limbs), HOST)
    return old, (new if perm is None else new[:, perm])


def _check_key_id(key_id: EvalKeyId, limbs: tuple[int, ...]) -> None:
    in_key = set(limbs)
    bad = [d for d in key_id.digits if d not in in_key or d >= key_id.level]
    if bad:
        raise ArgumentError(f"key {key_id}: digit limbs {bad} are not among its Q limbs 0..{key_id.level - 1}")
    if key_id.ext < 0 or key_id.ext > TOP_LIMB + 1 or key_id.level < 0:
        raise ArgumentError(f"key {key_id}: bad level or extension size")
    if KeyType(key_id.type) in (KeyType.BOOTSTRAP, KeyType.BOOTSTRAP2) and key_id.level < 1:
        raise ArgumentError(f"bootstrap key {key_id} needs level >= 1")


def key_secret_rows(ctx, key_id: EvalKeyId, secrets: Secrets, limbs, arith: ClientArith):
    """(s_old, s_new, perm): the secrets of key ``key_id`` per the table of the module docstring, in
    NTT form on ``limbs``, (len(limbs), N) uint32 arrays of ``arith``. For a rotation or conjugation
    ``s_new`` is s and ``perm`` the index array of the automorphism (s(X^g) = s[:, perm]), left to
    :meth:`~caramel.ckks.arith.ClientArith.rlwe_c0` (the compiled host kernel gathers as it goes);
    else ``perm`` is None."""
    t = KeyType(key_id.type)
    s = arith.secret_rows(secrets.s, ctx).take(limbs)
    eph = arith.secret_rows(secrets.s_eph, ctx).take(limbs) if t in (KeyType.EPHEMERAL, KeyType.BOOTSTRAP2) else None
    if t in (KeyType.ROTATION, KeyType.CONJUGATION):
        g = ctx.galois_element(key_id.rot) if t == KeyType.ROTATION else ctx.conjugation_element
        return s, s, ctx.permutation(g)
    if t == KeyType.EPHEMERAL:
        return eph, s, None
    qcol = arith.prime_column(ctx, limbs)
    if t == KeyType.RELIN:
        return s, arith.mulmod(s, s, qcol), None
    factor = arith.put(np.array([ctx.q(key_id.level - 1) % ctx.q(l) for l in limbs], dtype=np.uint64)[:, None])
    return s, arith.mulmod(s if t == KeyType.BOOTSTRAP else eph, factor, qcol), None  # BOOTSTRAP(2)


def redraw_a(ctx, limbs, a_state: PcgState, xp=None):
    """A key's ``c1 = a`` on ``limbs`` drawn again from ``a_state`` (:attr:`EvalKey.a_state`): the
    same draw as :func:`generate_evalkey_on`'s (:func:`~caramel.ckks.sampling.uniform_residues`, on
    the GPU with CuPy as ``xp``), so the same limbs bit for bit. (k, N) uint32 of module ``xp``."""
    return uniform_residues(ctx, tuple(int(l) for l in limbs), a_state.generator(), xp)


def generate_evalkey_on(ctx, key_id: EvalKeyId, secrets: Secrets, rng, device=None):
    """Draw key ``key_id``'s randomness on the host (``a`` then ``e``) and compute c0 on ``device``
    (:func:`caramel.ckks.device.chosen`).

    Returns (limbs, c0, c1, a_state): c0 and c1 on the device (not yet copied back), a_state the
    generator's state before ``a`` (:class:`~caramel.ckks.sampling.PcgState`, or None)."""
    dev = devmod.chosen(device)
    limbs = key_limbs(key_id)
    _check_key_id(key_id, limbs)
    a_state = PcgState.of(rng)
    a = dev.uniform(ctx, limbs, rng)
    e = dev.error(ctx.n, rng)
    s_old, s_new, perm = key_secret_rows(ctx, key_id, secrets, limbs, dev)
    big_p = extension_modulus(ctx, key_id.ext)
    p_mod = np.array([big_p % ctx.q(l) if l in key_id.digits else 0 for l in limbs], dtype=np.uint64)[:, None]
    c0 = dev.rlwe_c0(ctx, limbs, a, s_old, e, s_new, p_mod, perm)
    return limbs, c0, a, a_state


def _finish(key_id: EvalKeyId, limbs, c0: np.ndarray, c1: np.ndarray, a_state: PcgState | None) -> EvalKey:
    c0.setflags(write=False)
    c1.setflags(write=False)
    return EvalKey(key_id, limbs, c0, c1, a_state)


def generate_evalkey(ctx, key_id: EvalKeyId, secrets: Secrets, rng=None, device=None) -> EvalKey:
    """Generate the key ``key_id`` exactly as ISA.md 5.3 specifies (see module docstring).

    The draws (``a`` uniform on every limb, then ``e``) come from ``rng`` on the host; the products
    run on ``device`` (see :mod:`caramel.ckks.device`; default: the current client device)."""
    dev = devmod.chosen(device)
    limbs, c0, a, a_state = generate_evalkey_on(ctx, key_id, secrets, rng_of(rng), dev)
    return _finish(key_id, limbs, dev.get(c0), dev.get(a), a_state)


def generate_evalkeys(ctx, key_ids, secrets: Secrets, rng=None, device=None, *,
                      background: bool = False, on_device: bool = False) -> Mapping[EvalKeyId, EvalKey]:
    """Generate ``key_ids`` in order from one generator (the same draws as calling
    :func:`generate_evalkey` for each); on a GPU every key's products are queued before any copy back.

    ``background`` (GPU only): return at once a :class:`PendingKeys` whose halves a host thread
    copies back on a stream of its own (after every key's products), so that the copies overlap
    what the caller queues next (encrypting the inputs); else a dict of finished keys.
    ``on_device`` (GPU only): the keys' halves stay on the GPU (CuPy arrays, never copied back), for
    a GPU executor that copies them into its arena there."""
    rng = rng_of(rng)
    dev = devmod.chosen(device)
    made = [(k, *generate_evalkey_on(ctx, k, secrets, rng, dev)) for k in key_ids]
    if on_device and dev.on_gpu:
        return {k: EvalKey(k, limbs, c0, a, st) for k, limbs, c0, a, st in made}
    if background and dev.on_gpu:  # the copies overlap what the caller queues next
        futures = dev.get_in_background([arr for _, _, c0, c1, _ in made for arr in (c0, c1)])
        return PendingKeys([(k, limbs) for k, limbs, *_ in made], futures, [st for *_, st in made])
    return {k: _finish(k, limbs, dev.get(c0), dev.get(a), st) for k, limbs, c0, a, st in made}
