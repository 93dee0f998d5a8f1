"""The input image check (caramel.execute.memory): the deferred range check of an uploaded image
(check_plan_memory(defer_ranges=True) + check_ranges) refuses exactly what the host scan refuses,
with the same message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import caramel
from caramel.api import default_spec
from caramel.ckks.check import prepare_check
from caramel.ckks.keyset import generate_keyset, input_rng
from caramel.errors import BindingError
from caramel.execute.memory import check_plan_memory, check_ranges
from caramel.plan import build_plan
from caramel.ring import Context

EXAMPLES = Path(__file__).resolve().parents[2] / "programs"
CTX = Context(n=1024)


@pytest.fixture(scope="module")
def case():
    program = caramel.load_program(EXAMPLES / "MulRotate_4L_1c")
    plan = build_plan(program)
    keys = generate_keyset(program, CTX, 3)
    image = prepare_check(default_spec(program), program, CTX, rng=input_rng(1), secrets=keys.secrets,
                          keys=dict(keys.keys)).memory
    return plan, image


def _maxima(image, mems):
    """What the device computes after the upload: each row's largest value as uint32."""
    return [int(np.asarray(image[m]).astype(np.uint32).max()) for m in mems]


def _host_error(plan, image) -> str:
    with pytest.raises(BindingError) as err:
        check_plan_memory(plan, CTX, image)
    return str(err.value)


def _deferred_error(plan, image) -> str:
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    with pytest.raises(BindingError) as err:
        check_ranges(CTX, image, deferred, _maxima(image, deferred))
    return str(err.value)


def test_defer_lists_every_uint32_vector_limb_in_name_order(case):
    plan, image = case
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    vectors = sorted((m for m in image if np.ndim(image[m]) == 1 and image[m].dtype == np.uint32), key=str)
    read = {m for c in plan.chips for m in c.inputs}
    assert deferred == [m for m in vectors if m in read] and deferred
    check_ranges(CTX, image, deferred, _maxima(image, deferred))  # a good image passes
    assert check_plan_memory(plan, CTX, image) == []  # the host scan defers nothing


@pytest.mark.parametrize("where", [0, -1])
def test_a_bad_residue_is_refused_with_the_host_message(case, where):
    plan, image = case
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    mem = deferred[where]
    row = np.array(image[mem], copy=True)
    row[17] = CTX.q(mem.limb)  # the smallest bad residue
    bad = {**image, mem: row}
    msg = _deferred_error(plan, bad)
    assert msg == _host_error(plan, bad)
    assert f"{mem}: residues must lie in [0, q_{mem.limb} = {CTX.q(mem.limb)}), found" in msg


def test_several_bad_rows_are_all_named(case):
    plan, image = case
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    bad = dict(image)
    for m in deferred[:3]:
        bad[m] = np.full(CTX.n, 2**32 - 1, dtype=np.uint32)
    msg = _deferred_error(plan, bad)
    assert msg == _host_error(plan, bad) and all(str(m) in msg for m in deferred[:3])


def test_types_that_do_not_convert_exactly_are_scanned_on_the_host(case):
    plan, image = case
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    mem = deferred[0]
    wraps = np.asarray(image[mem], dtype=np.int64) + 2**32  # as uint32 it would look in range
    with pytest.raises(BindingError, match=rf"{mem.term}\({mem.limb}\): residues must lie"):
        check_plan_memory(plan, CTX, {**image, mem: wraps}, defer_ranges=True)
    negative = np.asarray(image[mem], dtype=np.int64)
    negative[0] = -1
    with pytest.raises(BindingError, match=r"found -1\.\."):
        check_plan_memory(plan, CTX, {**image, mem: negative}, defer_ranges=True)
    small = np.asarray(image[mem] % 200, dtype=np.uint8)  # exact on the device: deferred
    assert mem in check_plan_memory(plan, CTX, {**image, mem: small}, defer_ranges=True)


def test_other_problems_are_still_raised_before_any_upload(case):
    plan, image = case
    deferred = check_plan_memory(plan, CTX, image, defer_ranges=True)
    mem = deferred[0]
    with pytest.raises(BindingError, match=r"shape \(5,\)"):
        check_plan_memory(plan, CTX, {**image, mem: np.zeros(5, dtype=np.uint32)}, defer_ranges=True)
    with pytest.raises(BindingError, match="not provided"):
        check_plan_memory(plan, CTX, {m: v for m, v in image.items() if m != mem}, defer_ranges=True)
    with pytest.raises(ValueError):
        check_ranges(CTX, image, deferred, [0])


class _DeviceRow:
    """Stands for a row on the GPU: dtype, shape and ndim, and no implicit conversion to NumPy."""

    def __init__(self, a):
        self._a = np.asarray(a)
        self.dtype, self.shape, self.ndim = self._a.dtype, self._a.shape, self._a.ndim
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a device array")


def test_rows_on_the_device_are_deferred_not_converted(case):
    """Key rows kept on the GPU by the GPU client: checked for presence, type and shape, their
    residues left to the device (never converted to host arrays)."""
    plan, image = case
    on_device = {m: (_DeviceRow(a) if np.ndim(a) == 1 else a) for m, a in image.items()}
    deferred = check_plan_memory(plan, CTX, on_device, defer_ranges=True)
    assert deferred == check_plan_memory(plan, CTX, image, defer_ranges=True)
    bad = dict(on_device)
    m = deferred[0]
    bad[m] = _DeviceRow(np.zeros(7, dtype=np.uint32))
    with pytest.raises(BindingError, match="shape"):
        check_plan_memory(plan, CTX, bad, defer_ranges=True)
