"""NTT-friendly primes: the fixed prime list of caramel and the generator that reproduces it.

Decision 1 of the ISA: limb index L means ``PRIMES[L]``, the 64 largest primes below 2^28 with
q = 1 mod 2^17, in ascending order. q = 1 mod 2^17 makes every q = 1 mod 2N for all N <= 65536, so each
prime has a primitive 2N-th root of unity (the negacyclic NTT needs one).
"""

from __future__ import annotations

from caramel.errors import ArgumentError

# Bases that make Miller-Rabin deterministic for every n < 3.3 * 10^24 (covers all 64-bit integers).
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    """is_prime reports whether n is prime (deterministic Miller-Rabin, exact for n < 3.3e24)."""
    n = int(n)
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def ntt_primes(count: int, bits: int = 28, log_modulus: int = 17) -> tuple[int, ...]:
    """ntt_primes returns the ``count`` largest primes q < 2^bits with q = 1 mod 2^log_modulus, ascending.

    Candidates are q = 1 + j * 2^log_modulus for j = floor((2^bits - 2) / 2^log_modulus) downward.
    Raises ValueError when fewer than ``count`` such primes exist.
    """
    if count < 0 or bits < 2 or log_modulus < 1:
        raise ArgumentError(f"ntt_primes: bad arguments count={count}, bits={bits}, log_modulus={log_modulus}")
    step = 1 << log_modulus
    found: list[int] = []
    q = ((1 << bits) - 2) // step * step + 1
    while len(found) < count and q > 1:
        if is_prime(q):
            found.append(q)
        q -= step
    if len(found) < count:
        raise ArgumentError(f"only {len(found)} primes below 2^{bits} are = 1 mod 2^{log_modulus}; asked for {count}")
    return tuple(sorted(found))


# PRIMES is caramel's fixed prime list (ISA decision 1): ntt_primes(64, 28, 17), q_0 = 204865537 ... q_63 = 268042241.
PRIMES: tuple[int, ...] = (
    204865537, 205651969, 206307329, 207880193, 209059841, 210370561, 211025921, 211812353,
    214171649, 215482369, 215744513, 216137729, 216924161, 217317377, 218628097, 219676673,
    220594177, 221249537, 222035969, 222167041, 222953473, 223215617, 224002049, 224133121,
    225574913, 228065281, 228458497, 228720641, 230424577, 230686721, 230817793, 231473153,
    232390657, 232652801, 234356737, 235798529, 236584961, 236716033, 239337473, 239861761,
    240648193, 241827841, 244842497, 244973569, 245235713, 245760001, 246415361, 249561089,
    253100033, 253493249, 254279681, 256376833, 256770049, 257949697, 258605057, 260571137,
    260702209, 261488641, 261881857, 263323649, 263454721, 264634369, 265420801, 268042241,
)
