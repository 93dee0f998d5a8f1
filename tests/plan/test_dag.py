"""The dependency DAGs: SSA renaming and aliasing, raw/war/waw edges, cross-chip edges, linear
build time, DOT and JSON export."""

from __future__ import annotations

import json
import time

import networkx as nx
import pytest

from caramel.cli import dag_node_link
from caramel.parse import no_gc
from caramel.plan import dag
from caramel.plan.dag import PlanError
from caramel.program import Opcode, Stream

from plan_helpers import corpus, load_corpus, program_from_text, random_program

SMALL = ["MulRotate_4L_2c", "Relin2_4L_4c", "BootstrapModRaise_4L_2c", "PolyX8_10L_8c", "RotMulAdd_10L_1c"]


def test_copies_share_a_buffer():
    p = program_from_text(
        """
        load r0: i1(3)
        mov r1: r0 | 2
        spill r1[X]: v5(2)
        load r2: v5(2)
        add r3: r2, r0 | 3
        """
    )
    s = dag.ssa(p.streams[0])
    r0, r1, spilled, r2 = s.defs[0][0], s.defs[1][0], s.defs[2][0], s.defs[3][0]
    loaded = s.inputs[p.streams[0].instructions[0].srcs[0]]
    assert s.buf[r0] == s.buf[r1] == s.buf[spilled] == s.buf[r2] == s.buf[loaded]
    assert (s.tag[r0], s.tag[r1], s.tag[r2]) == (3, 2, 2)
    assert s.uses[3] == (spilled,) and s.producer[spilled] == 2  # the load reads what the spill wrote
    assert s.buf[s.defs[4][0]] not in {s.buf[r0]}  # a computed value gets its own buffer
    assert s.n_buffers == 2


def test_renaming_removes_false_dependencies():
    p = program_from_text(
        """
        load r0: i1(0)
        load r1: i2(0)
        add r2: r0, r1 | 0
        load r0: i1(1)
        mul r2: r0, r0 | 1
        store r2: v1(1)
        """
    )
    raw = dag.resource_graph(p.streams[0])
    deps = {(u[1], v[1]): d["dep"] for u, v, d in raw.edges(data=True)}
    assert deps[(2, 3)] == "war"  # load r0 overwrites what the add read
    assert deps[(0, 3)] == "waw"
    assert deps[(2, 4)] == "waw"  # both write r2
    assert deps[(3, 4)] == "raw"
    renamed = dag.ssa(p.streams[0]).graph()
    assert set((u[1], v[1]) for u, v in renamed.edges) == {(0, 2), (1, 2), (3, 4), (4, 5)}


def test_bcu_and_scalar_edges():
    p = program_from_text(
        """
        load r0: i1(0)
        load r1: i1(1)
        loas s0: s3(0)
        bci B0: [2,63], [0,1]
        pl1 B0: r0 | 0
        bcw B0: r1 | 1
        ntt r2: b0{1} | 63
        sud r3: r0, b0{0} | 2
        ads r4: r2, s0 | 63
        """
    )
    s = dag.ssa(p.streams[0])
    g = s.graph()
    edges = set((u[1], v[1]) for u, v in g.edges)
    assert {(3, 4), (3, 5), (0, 4), (1, 5)} <= edges  # bci -> pl1/bcw, sources -> unit inputs
    assert {(3, 6), (4, 6), (5, 6)} <= edges  # the first read converts: reads the group and its inputs
    assert (6, 7) in edges and (4, 7) not in edges  # later reads read the conversion
    assert (2, 8) in edges  # loas -> ads
    conv = s.conversions[6]
    assert conv.in_limbs == (0, 1) and conv.out_limbs == (2, 63) and sorted(conv.slots) == [0, 1]
    assert s.buf[conv.inputs[1]] == s.buf[s.defs[1][0]]  # bcw aliases its source
    assert s.buf[conv.inputs[0]] != s.buf[s.defs[0][0]]  # pl1 writes a new (INTT) buffer


@pytest.mark.parametrize("name", SMALL)
def test_renamed_edges_are_the_raw_edges(name):
    """Renaming keeps exactly the read-after-write edges of the resource graph."""
    program = load_corpus(name)
    for stream in program.streams:
        raw = {(u, v) for u, v, d in dag.resource_graph(stream).edges(data=True) if d["dep"] == "raw"}
        renamed = set(dag.ssa(stream).graph().edges)
        assert renamed == raw


@pytest.mark.parametrize("seed", range(8))
def test_renamed_edges_are_the_raw_edges_random(seed):
    program = random_program(seed, chips=2)
    for stream in program.streams:
        raw = {(u, v) for u, v, d in dag.resource_graph(stream).edges(data=True) if d["dep"] == "raw"}
        assert set(dag.ssa(stream).graph().edges) == raw


@pytest.mark.parametrize("name", SMALL)
def test_program_graph_is_a_dag_with_comm_edges(name):
    program = load_corpus(name)
    g = dag.program_graph(program)
    assert nx.is_directed_acyclic_graph(g)
    assert g.number_of_nodes() == program.instruction_count
    comm = [(u, v) for u, v, d in g.edges(data=True) if d["dep"] == "comm"]
    rcv = sum(1 for s in program.streams for i in s.instructions if i.op == Opcode.RCV)
    joi = sum(1 for s in program.streams for i in s.instructions if i.op == Opcode.JOI)
    dests = sum(1 for s in program.streams for i in s.instructions if i.op == Opcode.JOI and i.dst is not None)
    assert len(comm) == rcv + joi - dests
    assert all(u[0] != v[0] for u, v in comm)
    for c in range(program.chips):
        assert nx.is_directed_acyclic_graph(dag.resource_graph(program.streams[c]))


def test_all_corpus_programs_rename():
    for name in corpus():
        program = load_corpus(name)
        for stream in program.streams:
            s = dag.ssa(stream)
            assert len(s.uses) == len(stream.instructions)


def _repeat(stream: Stream, k: int) -> Stream:
    return Stream(stream.chip, stream.path, stream.instructions * k)


def test_build_time_is_linear():
    """Renaming and the resource graph of 4 copies of a stream take about 4 times as long as one
    (CPU time, best of 3, the cyclic collector paused as build_plan pauses it: its full collections scale with
    the whole test session's heap, not with the stream; a quadratic scan would take 16 times)."""
    stream = load_corpus("BootstrapLike_20L_1c").streams[0]
    stream = Stream(stream.chip, stream.path, stream.instructions[:8000])

    def cost(k: int) -> float:
        s = _repeat(stream, k)
        best = float("inf")
        for _ in range(3):
            with no_gc():
                t = time.process_time()
                dag.ssa(s).graph()
                dag.resource_graph(s)
                best = min(best, time.process_time() - t)
        return best

    one, four = cost(1), cost(4)
    assert four < 8 * one, f"4x the instructions took {four / one:.1f}x the time"


def test_errors_name_the_line():
    p = program_from_text("load r0: i1(0)\nadd r1: r0, r7 | 0")
    with pytest.raises(PlanError, match=r"instructions0:3: register r7 is read before it is written"):
        dag.ssa(p.streams[0])
    p = program_from_text("load r0: i1(0)\nbci B1: [2], [0,1]\npl1 B1: r0 | 0\nntt r1: b1{0} | 2")
    with pytest.raises(PlanError, match=r"B1 is read before inputs \[1\] are written"):
        dag.ssa(p.streams[0])
    p = program_from_text("load r0: i1(0)\nadd r1: r0[X], r0 | 0\nneg r2: r0 | 0")
    with pytest.raises(PlanError, match="r0 is read before"):  # [X] frees the register, as in the reference
        dag.ssa(p.streams[0])
    p = program_from_text("rcv @ 65537:2 r0: \nstore r0: v1(1)", "")
    with pytest.raises(PlanError, match="rcv @ 65537 has no matching dis on any chip"):
        dag.comm_edges(p)


def test_dot_and_json_export():
    program = load_corpus("Rescale_4L_2c")
    g = dag.program_graph(program)
    dot = dag.to_dot(g, program)
    assert dot.startswith("digraph caramel {") and "cluster_1" in dot and "style=dashed" in dot
    assert dot.count("->") == g.number_of_edges()
    data = json.loads(json.dumps(dag_node_link(g, program)))  # the JSON export (caramel plan --dag-json)
    assert data["graph"]["program"] == "Rescale_4L_2c"
    assert len(data["nodes"]) == program.instruction_count and len(data["edges"]) == g.number_of_edges()
    assert {e["dep"] for e in data["edges"]} == {"raw", "comm"}
    with pytest.raises(ValueError, match="too many for DOT"):
        dag.to_dot(g, program, max_nodes=5)
    reuse = program_from_text("load r0: i1(0)\nneg r1: r0 | 0\nload r0: i1(1)\nstore r0: v1(1)")
    raw = dag.to_dot(dag.resource_graph(reuse.streams[0]), reuse)
    assert 'label="war r0"' in raw and 'label="waw r0"' in raw and 'label="raw r0"' in raw
