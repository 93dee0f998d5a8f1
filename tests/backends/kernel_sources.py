"""Dump every CUDA kernel source the CUDA backend generates, without a GPU (for a machine-code comparison).

The modules come from :func:`caramel.execute.precompile.needed_modules` (what a run of a plan loads) for the plans
of the given programs at N = 4096, 8192 and 65536 in every arithmetic mode, one device a chip, plus the modules the
GPU tests load under the default configuration (every N of the tests, both butterfly forms, every prologue, the
fixed elementwise programs, the epilogue test programs, every tensor-core build). Each epilogue is dumped under every
launch bound that its launch may take. Keys say what a module is in words that do not depend on caramel's code
(``ntt/N=65536/lazy=1``, ``ew/<program>``, ``epi/N=8192/lazy=1/<program>/b=3``, ``tc/kc=2/unroll=1/minb=4``), so
that two trees' dumps can be compared kernel by kernel (:mod:`tests.backends.sass_compare`)::

    python -m tests.backends.kernel_sources OUT.json PROGRAM...
"""

from __future__ import annotations

import json
import re
import sys

from caramel.backends.cuda import basis, crt, elementwise
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.ntt.prologue import prologue_source
from caramel.backends.cuda.ntt.transform import kernel_names, transform_source
from caramel.backends.cuda.target import CUDA_TARGET
from caramel.execute.placement import device_programs
from caramel.execute.precompile import needed_modules
from bench.kernels import inner_product
from caramel.expr import Expr
from caramel.ring import Context, Mode

SIZES = (4096, 8192, 65536)


def expr_key(e: Expr) -> str:
    """A program's text in words of its own (operands, operations, outputs, gathered, transformed)."""
    body = ";".join(f"{o.op}({','.join(map(str, o.args))})" for o in e.ops)
    return (f"v{e.n_vec}s{e.n_scalar}|{body}|{','.join(map(str, e.outputs))}|g{','.join(map(str, e.gathered))}"
            f"|t{','.join(map(str, e.transformed))}")


def entries(module, config: KernelConfig) -> dict:
    """The dump entries of one :class:`~caramel.backends.cuda.kernel_set.Module`."""
    family = module.key[0]
    (code, names, _), *_ = module.candidates
    if family == "ntt":
        _, n, lazy = module.key
        return {f"ntt/N={n}/lazy={int(lazy)}": (code, names)}
    if family == "prologue":
        _, n, lazy, pk, mode = module.key
        return {f"pro/N={n}/lazy={int(lazy)}/pk={pk}/pmode={mode if pk != 1 else 0}/limb={int(pk != 2)}": (code, names)}
    if family == "elementwise":
        return {f"ew/{expr_key(module.key[1])}": (code, names)}
    if family == "epilogue":
        _, n, lazy, expr = module.key
        return {f"epi/N={n}/lazy={int(lazy)}/{expr_key(expr)}/b={b}": (code, names) for b, code in
                elementwise.epilogue_sources(expr, n.bit_length() - 1, lazy, config.epilogue)}
    if family == "basis" and module.key[1]:
        kc, minb = (re.search(rf"#define {d} (\d+)", code).group(1) for d in ("TC_KC", "TC_MINB"))
        unroll = re.search(r"#pragma unroll (\d+)", code).group(1)
        return {f"tc/kc={kc}/unroll={unroll}/minb={minb}": (code, names)}
    return {family: (code, names)}  # twiddle, gather, automorphism, crt, the tiled basis module


def inner_products(f: int, p: int, o: int, gathered: tuple[int, ...] = ()) -> Expr:
    """The epilogue test programs: :func:`bench.kernels.inner_product` with its F operands transformed."""
    return inner_product(f, p, o, True, gathered)[0]


def test_modules(config: KernelConfig) -> dict:
    """What the GPU tests load under ``config`` (the base tree's tests under its defaults)."""
    out = {}

    def put(key, code, names):
        out[key] = (code, tuple(names))

    for n in (16, 32, 256, 2048, 4096, 8192, 16384, 32768, 65536):
        logn = n.bit_length() - 1
        for lazy in (True, False):
            put(f"ntt/N={n}/lazy={int(lazy)}", transform_source(logn, lazy, config.ntt), kernel_names(logn))
            if n >= 4096:
                for pk in (0, 1, 2):
                    for pmode in ((0,) if pk == 1 else (0, 1, 2)):
                        put(f"pro/N={n}/lazy={int(lazy)}/pk={pk}/pmode={pmode}/limb={int(pk != 2)}",
                            prologue_source(logn, pk, pmode, lazy, pk != 2),
                            ["ntt_fwd_pro" if n <= 4096 else "ntt_fwd_col_pro"])
    for e in (elementwise.ADD, elementwise.SUB, elementwise.MUL, elementwise.NEG, elementwise.COPY,
              elementwise.ADD_SCALAR, elementwise.SUB_SCALAR, elementwise.MUL_SCALAR):
        put(f"ew/{expr_key(e)}", elementwise.plain_source(e, config.elementwise.threads), [elementwise.kernel_name(e)])
    for n in (8192, 65536):
        for fpo in ((1, 1, 1), (2, 13, 2), (3, 2, 4), (5, 7, 2), (8, 8, 3), (9, 4, 2), (12, 12, 4), (14, 18, 5),
                    (16, 1, 1)):
            e = inner_products(*fpo)
            for b, code in elementwise.epilogue_sources(e, n.bit_length() - 1, True, config.epilogue):
                put(f"epi/N={n}/lazy=1/{expr_key(e)}/b={b}", code, [elementwise.kernel_name(e)])
    modes = [f"base_convert_tiled_{m}" for m in basis.MODES]
    put("basis", basis.source(), modes + ["sud_lift"])
    put("crt", crt.source(),
        [f"rsv_{m}" for m in range(1, 9)] + [f"mod_{m}" for m in range(1, 9)] + ["gather_rows", "scatter_rows"])
    for kc in range(1, 9):
        for unroll, minb in ((1, 4), (1, 6), (2, 4)):
            put(f"tc/kc={kc}/unroll={unroll}/minb={minb}", basis.tc_source(kc, unroll, minb),
                [f"base_convert_tc_{m}" for m in basis.MODES])
    return out


def dump(programs, config: KernelConfig | None = None) -> dict:
    """{key: {"code": source, "names": kernel names}} of every module (module docstring)."""
    from caramel.parse import load_program
    from caramel.plan import build_plan

    config = config or KernelConfig()
    out = dict(test_modules(config))
    for folder in programs:
        program = load_program(folder)
        plan = build_plan(program, target=CUDA_TARGET)
        for n in SIZES:
            ctx = Context(n)
            progs = device_programs(plan, len(plan.chips), ctx.primes, keep_inputs=True)
            for module in needed_modules(progs, plan, ctx, list(Mode), config):
                for key, (code, names) in entries(module, config).items():
                    known = out.get(key, (code, ()))
                    assert known[0] == code, key
                    out[key] = (code, tuple(sorted(set(known[1]) | set(names))))
    return {key: {"code": code, "names": sorted(names)} for key, (code, names) in out.items()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    modules = dump(argv[1:])
    with open(argv[0], "w") as f:
        json.dump(modules, f, indent=0, sort_keys=True)
    print(f"{len(modules)} modules, {sum(len(v['names']) for v in modules.values())} kernels", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
