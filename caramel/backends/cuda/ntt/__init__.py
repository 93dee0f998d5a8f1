"""Batched negacyclic NTT and INTT over arena rows, one prime per row.

Convention (ISA.md section 3, SEAL's Harvey NTT): ``ntt`` maps coefficients a_0..a_{N-1} to
A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q (bit-reversed output); ``intt`` is its exact inverse
(N^-1 included). Inputs and outputs are canonical residues.

Algorithm: the radix-2 Cooley-Tukey loop with psi powers in bit-reversed order (stage m = 2^s uses
``psi^br(m + i)`` for group i; Gentleman-Sande with the inverse powers for ``intt``), with Harvey's
lazy butterflies and Shoup twiddle products. With primes below 2^28 the forward butterflies reduce only at the first
stage of each pass (values below 16q <= 2^32), none in the transform's first pass (canonical inputs), and the inverse
butterflies only where a value's bound, known at compile time, requires it (butterflies.cuh); with larger primes
they reduce every stage. Data is staged in shared memory; stages run in passes of up to RADIX_LOG (4) stages held in
registers (16 points per virtual thread), with a __syncthreads between passes (a __syncwarp in the warp tiles).
Conditional subtractions are an add and an unsigned min (csub); 2q, 4q and 8q are read from the prime table.

The package, one module a concept, the shared CUDA C in ``.cuh`` files beside them:

* :mod:`.common`: shapes, the lazy bound (:func:`ring_lazy`), the modules' header (butterflies.cuh, passes.cuh,
  warp_tiles.cuh);
* :mod:`.tables`: the warp tiles' twiddle tables and shared memory;
* :mod:`.transform`: the transform kernels (small, column, row) and their launch: :func:`ntt`, :func:`intt`;
* :mod:`.fused`: the inverse in one kernel (both passes' pieces interleaved);
* :mod:`.prologue`: forward NTTs whose load computes their input (:func:`ntt_prologue`);
* :mod:`.epilogue`: elementwise programs that run the forward NTT's second pass in their load.

Every kernel's source is a pure function of the ring (N, lazy) and :class:`~caramel.backends.cuda.config.KernelConfig`;
every launch takes the configuration (default ``KernelConfig()``).
"""

from caramel.backends.cuda.ntt.common import ring_lazy
from caramel.backends.cuda.ntt.fused import counter_words
from caramel.backends.cuda.ntt.prologue import PROLOGUE_CODES, PrologueTables, ntt_prologue
from caramel.backends.cuda.ntt.transform import intt, launch, ntt

__all__ = ["PROLOGUE_CODES", "PrologueTables", "counter_words", "intt", "launch", "ntt", "ntt_prologue", "ring_lazy"]
