"""Compare the machine code of two dumps of CUDA kernel sources, kernel by kernel, without a GPU.

A dump (:mod:`tests.backends.kernel_sources`) maps a key (what the module is: ``ntt/N=65536/lazy=1``,
``epi/N=8192/lazy=1/<program>/b=3``, ...) to a module's full source and the kernels of it that caramel launches.
Each distinct source is compiled once with ``nvcc -cubin -arch=sm_90`` (the options caramel gives NVRTC) into a
cache folder named by its SHA-256, and every kernel's code section (``.text.<name>``, with its register count) is
and its attributes (registers, stack, shared memory, parameters, launch bounds: :func:`attributes`) are read from
the ELF file. Two dumps agree on a kernel when its key and name are in both and its code bytes and attributes are
equal::

    python -m tests.backends.sass_compare BASE.json NEW.json [--cache DIR] [--jobs J]

prints every kernel that differs or is in one dump only, and a summary; exit status 1 when some common kernel
differs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

NVCC_OPTIONS = ("-cubin", "-arch=sm_90", "--std=c++17", "--fmad=false")


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF file (a cubin)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    strtab = data[names[4]:names[4] + names[5]]
    out = {}
    for name, kind, _, _, offset, size, _, _, _, _ in headers:
        label = strtab[name:strtab.index(b"\0", name)].decode()
        out[label] = b"\0" * size if kind == 8 else data[offset:offset + size]  # 8: SHT_NOBITS (its size)
    return out


def nv_info(blob: bytes) -> list[tuple[int, bytes]]:
    """The (attribute, value) records of an ``.nv.info`` section."""
    out, i = [], 0
    while i < len(blob):
        fmt, attr = blob[i], blob[i + 1]
        size = struct.unpack_from("<H", blob, i + 2)[0] if fmt == 4 else 0  # 4: a sized value; else 2 bytes inline
        out.append((attr, blob[i + 4:i + 4 + size] if fmt == 4 else blob[i + 2:i + 4]))
        i += 4 + size
    return out


def symbols(data: bytes, sections: dict[str, bytes]) -> dict[str, int]:
    """Symbol name -> its index in ``.symtab``."""
    strtab, table = sections[".strtab"], sections[".symtab"]
    out = {}
    for i in range(len(table) // 24):
        name = struct.unpack_from("<I", table, 24 * i)[0]
        out[strtab[name:strtab.index(b"\0", name)].decode()] = i
    return out


def attributes(data: bytes, sections: dict[str, bytes], name: str) -> tuple:
    """What the loader learns of kernel ``name`` besides its code: its registers, frame and stack (the module's
    ``.nv.info`` records of its symbol), its shared memory, and its own ``.nv.info.<name>`` records but those that
    name a section by its symbol index (0x0a, which moves when the module's other kernels change)."""
    index = symbols(data, sections)[name]
    mine = [(a, v[4:]) for a, v in nv_info(sections[".nv.info"]) if struct.unpack_from("<I", v)[0] == index]
    own = [(a, v) for a, v in nv_info(sections.get(f".nv.info.{name}", b"")) if a != 0x0A]
    return tuple(mine), len(sections.get(f".nv.shared.{name}", b"")), tuple(own)


def compile_source(code: str, cache: Path) -> Path:
    """The cubin of ``code`` (compiled once into ``cache``)."""
    cubin = cubin_path(code, cache)
    digest = cubin.stem
    if not cubin.exists():
        src = cache / f"{digest}.cu"
        src.write_text(code)
        tmp = cache / f"{digest}.{os.getpid()}.tmp"
        subprocess.run(["nvcc", *NVCC_OPTIONS, "-o", str(tmp), str(src)], check=True, capture_output=True)
        tmp.replace(cubin)
    return cubin


def cubin_path(code: str, cache: Path) -> Path:
    return cache / f"{hashlib.sha256(code.encode()).hexdigest()}.cubin"


def kernel_code(dump: dict, cache: Path, jobs: int, compiled_only: bool = False) -> dict[tuple[str, str], tuple]:
    """(key, kernel name) -> (code bytes, :func:`attributes`) of every kernel of ``dump`` (``compiled_only``: of the
    modules already in ``cache``, compiling nothing)."""
    if compiled_only:
        dump = {k: v for k, v in dump.items() if cubin_path(v["code"], cache).exists()}
    codes = sorted({v["code"] for v in dump.values()})
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        cubins = dict(zip(codes, pool.map(lambda c: compile_source(c, cache), codes)))
    out = {}
    for key, entry in dump.items():
        data = cubins[entry["code"]].read_bytes()
        sections = elf_sections(data)
        for name in entry["names"]:
            if f".text.{name}" not in sections:
                raise KeyError(f"{key}: no kernel {name} in its cubin")
            # a module of one kernel (an elementwise program's, named by a hash of the program's text) is that kernel
            label = "(its kernel)" if len(entry["names"]) == 1 else name
            out[key, label] = (sections[f".text.{name}"], attributes(data, sections, name))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument("--cache", default="/tmp/sass-cache")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--compiled-only", action="store_true", help="compare the modules already compiled into the cache")
    args = p.parse_args(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    base, new = (json.loads(Path(f).read_text()) for f in (args.base, args.new))
    have = {}
    for label, dump in (("base", base), ("new", new)):
        have[label] = kernel_code(dump, cache, args.jobs, args.compiled_only)
        print(f"{label}: {len(dump)} modules, {len({e['code'] for e in dump.values()})} distinct sources, "
              f"{len(have[label])} kernels", file=sys.stderr)
    common = sorted(set(have["base"]) & set(have["new"]))
    differ = [k for k in common if have["base"][k] != have["new"][k]]
    keys = {label: {key for key, _ in have[label]} for label in have}
    for label, other in (("base", "new"), ("new", "base")):
        for key, name in sorted(set(have[label]) - set(have[other])):
            if key in keys[other]:  # (with --compiled-only, a module of one dump only may not be compiled yet)
                print(f"only in {label}: {key} {name}")
    for key, name in differ:
        (b, ib), (n, i_n) = have["base"][key, name], have["new"][key, name]
        print(f"DIFFERS: {key} {name}: code {len(b)} vs {len(n)} bytes{'' if b != n else ' (equal)'}, "
              f"attributes {'equal' if ib == i_n else 'differ'}")
    same = len(common) - len(differ)
    print(f"{same} of {len(common)} common kernels identical ({len(differ)} differ) in "
          f"{len({key for key, _ in common})} common modules")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
