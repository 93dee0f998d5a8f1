"""The CUDA kernels' settings as values: one frozen dataclass per kernel family, grouped in :class:`KernelConfig`.

A :class:`~caramel.backends.cuda.backend.CupyBackend` takes one ``KernelConfig`` (``KernelConfig()``: the settings
of record, the ones docs/PERFORMANCE.md measured best) and passes it to the functions that generate and launch its
kernels; a kernel's source is a pure function of its settings and the ring, and compiled kernels are cached by their
source text (:mod:`caramel.backends.cuda.compiler`), so two configurations never share a kernel they should not.
Nothing changes a configuration after it is made: a variant is a new value, e.g. for a benchmark::

    KernelConfig.with_settings(["ntt.warps=2", "epilogue.min_blocks=3/2"])

Only real parameters are settings (sizes, launch bounds, thresholds); the alternatives that lost to the chosen
kernels are gone from the code (docs/PERFORMANCE.md names each and the commit that holds it).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NttConfig:
    """The NTT kernels (:mod:`caramel.backends.cuda.ntt`).

    ``split_from``: (forward, inverse) first stage of the row kernels that takes its twiddle as a row factor times a
    factor shared by all rows (earlier stages read one table entry; clamped to 4 .. 8, 8: none);
    ``warps``: warps a block of the row kernels (a power of two dividing the warp tiles of a limb, 2^(log2 N - 10));
    ``fused_lag``: limbs by which a one-kernel transform's second pass trails its first (their intermediates wait in
    L2); ``fused_min_blocks``: the one-kernel transforms' launch bound (resident blocks a multiprocessor);
    ``col_min_blocks``: the forward column kernel's launch bound (0: none)."""

    split_from: tuple[int, int] = (5, 5)
    warps: int = 4
    fused_lag: int = 48
    fused_min_blocks: int = 4
    col_min_blocks: int = 6

    def __post_init__(self):
        _check(len(self.split_from) == 2 and all(0 <= s <= 8 for s in self.split_from),
               "ntt.split_from", "two stages in 0 .. 8", self.split_from)
        _check(self.warps in (1, 2, 4, 8), "ntt.warps", "1, 2, 4 or 8", self.warps)
        _check(self.fused_lag >= 1, "ntt.fused_lag", "at least 1", self.fused_lag)
        _check(1 <= self.fused_min_blocks <= 8, "ntt.fused_min_blocks", "1 .. 8", self.fused_min_blocks)
        _check(0 <= self.col_min_blocks <= 8, "ntt.col_min_blocks", "0 .. 8", self.col_min_blocks)


@dataclass(frozen=True)
class EpilogueConfig:
    """The NTT epilogue kernels (an elementwise program reading the forward transform's second pass in its load,
    :mod:`caramel.backends.cuda.ntt.epilogue`).

    ``min_blocks``: the resident blocks a multiprocessor asked of the launch bounds, in order: a kernel takes the
    first whose blocks fit in shared memory and under which it compiles without spilling, else the last;
    ``split_from``: the first split stage of their row passes (as :attr:`NttConfig.split_from`);
    ``scalar_from``: with one group of rows a block, from this many transformed operands the program runs one
    residue a thread (fewer registers than four a thread; 17: never)."""

    min_blocks: tuple[int, ...] = (4, 3, 2)
    split_from: int = 5
    scalar_from: int = 5

    def __post_init__(self):
        _check(len(self.min_blocks) >= 1 and all(1 <= b <= 8 for b in self.min_blocks), "epilogue.min_blocks",
               "one or more of 1 .. 8", self.min_blocks)
        _check(0 <= self.split_from <= 8, "epilogue.split_from", "0 .. 8", self.split_from)
        _check(1 <= self.scalar_from <= 17, "epilogue.scalar_from", "1 .. 17", self.scalar_from)


@dataclass(frozen=True)
class ElementwiseConfig:
    """The plain elementwise kernels (:mod:`caramel.backends.cuda.elementwise`): ``threads`` a block, each thread
    taking 4 residues (one 16-byte word) of a row."""

    threads: int = 256

    def __post_init__(self):
        _check(self.threads in (32, 64, 128, 256, 512, 1024), "elementwise.threads", "a power of two in 32 .. 1024",
               self.threads)


@dataclass(frozen=True)
class KernelConfig:
    """The settings of every CUDA kernel family; ``KernelConfig()`` is the configuration of record."""

    ntt: NttConfig = field(default_factory=NttConfig)
    epilogue: EpilogueConfig = field(default_factory=EpilogueConfig)
    elementwise: ElementwiseConfig = field(default_factory=ElementwiseConfig)

    def with_settings(self, settings: typing.Iterable[str]) -> "KernelConfig":
        """This configuration with ``settings`` applied, each ``FAMILY.NAME=VALUE`` (``ntt.warps=2``; a tuple's
        entries separated by ``/``: ``ntt.split_from=6/5``). Raises ValueError naming an unknown family or setting,
        or a value that is not an integer (or a tuple of them) or is out of range."""
        changes: dict[str, dict[str, object]] = {}
        for text in settings:
            name, eq, value = str(text).partition("=")
            family, dot, attr = name.strip().partition(".")
            groups = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            if not eq or not dot or family not in groups:
                raise ValueError(f"kernel setting {text!r}: write FAMILY.NAME=VALUE with FAMILY one of "
                                 f"{', '.join(groups)}")
            kinds = typing.get_type_hints(type(groups[family]))
            if attr not in kinds:
                raise ValueError(f"kernel setting {text!r}: {family} has no setting {attr!r} (it has "
                                 f"{', '.join(kinds)})")
            changes.setdefault(family, {})[attr] = _parse(text, value.strip(), kinds[attr])
        return dataclasses.replace(self, **{family: dataclasses.replace(getattr(self, family), **values)
                                            for family, values in changes.items()})

    def settings(self) -> list[str]:
        """Every setting that differs from the configuration of record, as :meth:`with_settings` reads it."""
        out = []
        for group in dataclasses.fields(self):
            mine, default = getattr(self, group.name), getattr(KernelConfig(), group.name)
            for f in dataclasses.fields(mine):
                value = getattr(mine, f.name)
                if value != getattr(default, f.name):
                    text = "/".join(map(str, value)) if isinstance(value, tuple) else str(value)
                    out.append(f"{group.name}.{f.name}={text}")
        return out


def _parse(text: str, value: str, kind) -> object:
    """``value`` read as ``kind`` (int, or a tuple of ints written a/b/c)."""
    try:
        if typing.get_origin(kind) is tuple:
            return tuple(int(v) for v in value.split("/"))
        return int(value)
    except ValueError:
        raise ValueError(f"kernel setting {text!r}: {value!r} is not "
                         f"{'integers separated by /' if typing.get_origin(kind) is tuple else 'an integer'}") from None


def _check(ok: bool, name: str, want: str, value) -> None:
    if not ok:
        raise ValueError(f"kernel setting {name}: {value!r} is not {want}")


__all__ = ["ElementwiseConfig", "EpilogueConfig", "KernelConfig", "NttConfig"]
