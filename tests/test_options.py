"""RunOptions (:mod:`caramel.options`): every field checked where the value is made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from caramel.errors import ArgumentError
from caramel.options import RunOptions, shared_names
from caramel.ring import Mode


def test_defaults_and_conversions():
    opts = RunOptions(mode="textbook", seed=np.int64(3), device_ids=[2, 0], shared=" plaintexts, em* ")
    assert opts.mode is Mode.TEXTBOOK and opts.seed == 3 and type(opts.seed) is int
    assert opts.device_ids == (2, 0) and opts.shared == ("plaintexts", "em*")
    assert opts.keys_seed == 3 and opts.with_(key_seed=9).keys_seed == 9
    assert RunOptions().n == 65536 and RunOptions().check == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 4  # type: ignore[misc]


@pytest.mark.parametrize(("fields", "message"), [
    ({"n": 1000}, "n must be a power of two"),
    ({"n": 131072}, "n must be a power of two from 16 to 65536"),
    ({"mode": "fast"}, "mode must be one of exact, textbook, emulator"),
    ({"backend": "tpu"}, "backend must be one of auto, cpu, cpu-plan, gpu"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"key_seed": 1.5}, "key_seed must be an integer >= 0"),
    ({"gpus": 0}, "gpus must be a positive integer"),
    ({"gpus": True}, "gpus must be a positive integer"),
    ({"streams": 0}, "streams must be a positive integer"),
    ({"depth": -2}, "depth must be a positive integer"),
    ({"device_ids": [0, 0]}, "device_ids must be distinct integers"),
    ({"device_ids": "0,1"}, "device_ids must be a list"),
    ({"gpus": 3, "device_ids": [0, 1]}, "gpus = 3 but only 2 device_ids"),
    ({"client": "tpu"}, "client must be one of auto, cpu, gpu"),
    ({"check": 3}, "check must be 'auto', a check file's path"),
    ({"shared": ["x", ""]}, "shared must be input names"),
    ({"fusion": True}, "fusion must be one of on, off, auto"),
])
def test_each_bad_field_is_named(fields, message):
    with pytest.raises(ArgumentError, match=message):
        RunOptions(**fields)


def test_several_bad_fields_are_named_together():
    with pytest.raises(ArgumentError, match="n must be.*; seed must be"):
        RunOptions(n=3, seed=-1)


def test_of_builds_from_fields_and_refuses_unknown_ones():
    base = RunOptions(n=1024)
    assert RunOptions.of(base, seed=7) == RunOptions(n=1024, seed=7)
    assert RunOptions.of(None, backend="cpu").backend == "cpu" and RunOptions.of(base) is base
    with pytest.raises(ArgumentError, match=r"unknown option\(s\) device, gpu .*RunOptions fields"):
        RunOptions.of(base, device="cpu", gpu=1)
    with pytest.raises(ArgumentError, match="options must be a RunOptions"):
        RunOptions.of({"n": 1024})


def test_shared_names_by_kind_name_and_pattern():
    kinds = {"x": "ciphertext", "w0": "plaintext", "w1": "plaintext", "s": "scalar"}
    assert shared_names(("plaintexts",), kinds) == ("w0", "w1")
    assert shared_names(("s", "w1"), kinds) == ("w1", "s")  # in the inputs' order
    assert shared_names(("w*", "scalars"), kinds) == ("w0", "w1", "s")
    assert shared_names(("ciphertexts",), {"p": "plaintext"}) == ()  # a kind may select nothing
    with pytest.raises(ArgumentError, match="'z' names no input"):
        shared_names(("z",), kinds)


def test_the_ranks_of_one_run_fuse_unless_told_off():
    """Process mode and a cluster's partitioned run take ``auto`` (and an unset option) as ``on``: one plan for all."""
    from caramel.options import ranks_fuse

    assert [ranks_fuse(f) for f in ("on", "off", "auto", None)] == [True, False, True, True]
