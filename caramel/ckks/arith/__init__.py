"""The client's arithmetic (keys, encoding, encryption, decryption) behind one interface.

:class:`ClientArith` (:mod:`~caramel.ckks.arith.base`) writes each formula once against an array
module; two implementations supply the primitives: :class:`HostArith` (:data:`HOST`: NumPy, with
the compiled kernels of :mod:`~caramel.ckks.arith.jit` where Numba is installed) and
:class:`GpuArith` (:data:`GPU`: CuPy and caramel's CUDA NTT). Both give the same bits.
:mod:`caramel.ckks.device` chooses between them (``device="cpu"``/``"gpu"``, :func:`~caramel.ckks.device.using`).
"""

from caramel.ckks.arith.base import ClientArith, ClientDeviceError, DeviceKind, SecretRows, small_residues
from caramel.ckks.arith.gpu import CUDA_NTT_SIZES, GPU, GpuArith
from caramel.ckks.arith.host import HOST, HostArith

__all__ = ["CUDA_NTT_SIZES", "GPU", "HOST", "ClientArith", "ClientDeviceError", "DeviceKind", "GpuArith", "HostArith",
           "SecretRows", "small_residues"]
