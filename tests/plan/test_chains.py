"""Transforms split beside their conversions (caramel.plan.chains.conversion_chains): the pieces sit next to
the conversion they feed or read, rows are only regrouped, and the plan computes the same values."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import pytest

from caramel.execute.drive import run_plan
from caramel.plan import Kind, build_plan
from caramel.plan.cache_model import plan_traffic
from caramel.plan.chains import conversion_chains, kernel_deps
from caramel.ring import Context

from plan_helpers import check_plan, corpus, load_corpus, random_memory, store_mismatches

SPLIT = ("BootstrapModRaise", "Relin2")  # corpus families whose plans have transforms to split


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def writer_and_readers(kernels):
    writer, readers = {}, {}
    for k, kernel in enumerate(kernels):
        for b in kernel.reads():
            readers.setdefault(b, []).append(k)
        for b in kernel.writes():
            assert b not in writer, "plan buffers are written once"
            writer[b] = k
    return writer, readers


@pytest.mark.parametrize("name", ["Relin2_10L_1c", "Relin2_4L_2c", "BootstrapModRaise_4L_4c"])
def test_pieces_sit_beside_their_conversions(name):
    plan = build_plan(load_corpus(name))
    chained = conversion_chains(plan)
    check_plan(chained)
    split = 0
    for before, after in zip(plan.chips, chained.chips):
        kernels = after.kernels
        assert after.deps == kernel_deps(kernels)
        # the same rows of each kind; conversions and communication in the same order
        for kind in Kind:
            assert Counter(r for k in before.kernels if k.kind is kind for r in k.rows) == \
                Counter(r for k in kernels if k.kind is kind for r in k.rows)
        for kind in (Kind.BASECONV, Kind.COMM, Kind.ELEMENTWISE):
            assert [k for k in before.kernels if k.kind is kind] == [k for k in kernels if k.kind is kind]
        writer, readers = writer_and_readers(kernels)
        for k, kernel in enumerate(kernels):
            # every read follows its write, in the new order too
            assert all(writer[b] < k for b in kernel.reads() if b in writer)
            if kernel not in before.kernels:  # a piece
                split += 1
                assert kernel.kind in (Kind.NTT, Kind.INTT)
                if kernel.kind is Kind.NTT:
                    producers = {max(writer[b] for b in row.ins) for row in kernel.rows}
                    assert len(producers) == 1 and kernels[producers.pop()].kind is Kind.BASECONV
                    assert kernels[k - 1].kind is Kind.BASECONV or kernels[k - 1].kind is Kind.NTT
                else:
                    first = {min(readers[b]) for row in kernel.rows for b in row.outs}
                    assert len(first) == 1 and kernels[first.pop()].kind is Kind.BASECONV
    assert split > 0


def test_chains_cut_modelled_traffic():
    """The point of the pass: with an L2 of 16 limbs, a 10L key switch's limbs come back from the cache."""
    plan = build_plan(load_corpus("Relin2_10L_1c"))
    assert plan_traffic(conversion_chains(plan), 16).memory < plan_traffic(plan, 16).memory


def test_plans_without_conversions_are_unchanged():
    plan = build_plan(load_corpus("Mul_4L_1c"))
    assert conversion_chains(plan).chips == plan.chips


@pytest.mark.parametrize("name", [n for n in corpus(limbs=(4, 10), chips=(1, 2, 4)) if n.split("_")[0] in SPLIT])
def test_chained_plans_compute_the_same_stores(name):
    program = load_corpus(name)
    ctx = context(256)
    memory = random_memory(program, ctx, seed=7)
    plan = build_plan(program)
    for mode in ("exact", "textbook"):
        assert not store_mismatches(run_plan(plan, ctx, memory, mode), run_plan(conversion_chains(plan), ctx, memory, mode))
