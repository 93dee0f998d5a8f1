"""caramel.arrays: telling device arrays from host ones, and bringing small ones to the host, without CuPy."""

import numpy as np

from caramel.arrays import is_device_array, to_host


class _Exported:
    """A stand-in device array: it exports the CUDA array interface and copies down through ``get``."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<i8", "data": (0, False), "version": 3}

    def __init__(self, values):
        self.values, self.copies = values, 0

    def get(self):
        self.copies += 1
        return np.array(self.values)


def test_to_host_copies_a_device_array_down_once():
    dev = _Exported([3, 4])
    assert is_device_array(dev)
    host = to_host(dev)
    assert isinstance(host, np.ndarray) and host.tolist() == [3, 4] and dev.copies == 1


def test_to_host_leaves_host_data_as_numpy_gives_it():
    a = np.arange(3)
    assert to_host(a) is a
    assert to_host([True, False]).dtype == np.bool_
    # a host object that happens to have a ``get`` (a dict) is host data: not asked to copy itself down
    got = to_host({"a": 1})
    assert isinstance(got, np.ndarray) and got.shape == () and got.item() == {"a": 1}
