"""NTT epilogues: an elementwise program whose transformed operands are read through the forward transform's second
pass, run in its load, so that the transform's output is never written in full and read back.

The transformed operands' limbs hold what the column kernel wrote (a *half* NTT, :func:`~.transform.ntt` with
``half``), and the kernel runs the row pass of its tile of them in its load. Block = G groups of 4 rows of the
(N/256) x 256 view (G = 8 // F for F <= 8 transformed operands, else 1), 8 warps; its S = F G row passes are slots,
slot s the row pass of transformed operand s mod F on group s / F, each with a warp tile of shared memory. Shared
memory: the split-factor table tl (copied by all threads), one table wt a group (its slots are the same rows; copied
by the group's first warp, wtile_table), then the S warp tiles (copied by warp s mod 8, wtile_async), then the staged
operands. Warp w runs slots w and w + 8 (at most PW = 2 a warp, F <= 16) as a warp of the row kernel does (wpass);
with one group and S not a multiple of 8, the 2 S row pairs (wpass's it) are dealt over the warps instead (F = 12: 3
row pairs a warp, not 4 or 2). Then threads evaluate the program (:mod:`caramel.backends.cuda.elementwise`):
_EVAL_WORDS, 4 residues a thread as the plain elementwise kernels, or with one group from
:attr:`~caramel.backends.cuda.config.EpilogueConfig.scalar_from` operands _EVAL_SCALAR, one residue a thread in 4
steps: the transformed operands from shared memory (fwd_final: canonical), the others from memory, the program, the
stores. With several groups (G > 1), a group's F warps take its 4 rows as soon as their own row passes are done (a
named barrier of the group), so that the warps drift apart as the row kernel's do and one group's loads overlap
another's row passes; with one group all threads take it after a block barrier, and thread e copies word e of the
block's tile of some plain operands into shared memory (cp.async, a commit group of its own, after the tables' and
tiles'; :func:`epilogue_staged`) before the row passes and waits for it after them: the body reads those operands
from ``stage``. Launch bounds: :attr:`~caramel.backends.cuda.config.EpilogueConfig.min_blocks`.
"""

from __future__ import annotations

from caramel.backends.cuda.config import EpilogueConfig
from caramel.backends.cuda.ntt.common import ROW_LOG, SMEM_SM, WPITCH, fill, header
from caramel.backends.cuda.ntt.tables import split_stage, warp_table_entries

EPILOGUE_WARPS = 8  # warps a block of the epilogue kernels (one or two row passes each)
EPILOGUE_MAX = 2 * EPILOGUE_WARPS  # transformed operands an epilogue kernel takes at most (plan's MAX_TRANSFORMED)

_EPILOGUE = r"""
extern "C" __global__ void __launch_bounds__({threads}, {min_blocks}) {name}(
        u32* arena, const int* __restrict__ vec_slots, const int* __restrict__ scalar_idx,
        const int* __restrict__ out_slots, const int* __restrict__ prime_idx,
        const u32* __restrict__ scalars, const u32* __restrict__ pt, int n4, int tiles{params},
        const uint2* __restrict__ tw_all, const uint2* __restrict__ tl_all) {
    constexpr int SF = {sf}, SFT = {sft}, WT = 4 * ((1 << SFT) - 1) + 4 * (8 - SF), F = {f};
    constexpr int G = {g}, S = F * G, PW = (S + {warps} - 1) / {warps};  // see _EPILOGUE's doc (G: epilogue_groups)
    constexpr bool APART = G > 1;  // each group's warps evaluate it on their own (with one group, all warps)
    constexpr bool BALANCE = G == 1 && S % {warps} != 0;  // the row pairs dealt over the warps
    constexpr int TILE = 4 * WPITCH;  // words of a slot's warp tile
    extern __shared__ __align__(16) u32 dyn[];
    uint2* tl = (uint2*)dyn;
    u32* tbase = dyn + 480 + G * 2 * WT;  // after tl and the G groups' tables: slot s at tbase + TILE s
    const int r = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const u64 mu = prime_mu(pt, pi);
    const u32 m32 = (u32)(mu >> 32);  // prime_m32, for fwd_final
    (void)mu;
    const int grp = G == 1 ? 0 : warp / F;  // this warp's group (with one group, warps past F balance its row pairs)
    const int bt0 = (1 << A_BITS) + 4 * (G * tile + grp);  // its 4 rows (every slot of it)
    const uint2* tw = tw_all + (u64)pi * NN;
    uint2* wt = (uint2*)(dyn + 480 + grp * 2 * WT);  // its group's table (its slots' rows)
#pragma unroll
    for (int p = 0; p < PW; ++p) {
        const int f = (warp + p * {warps}) % F;
        const int k = {operand_of};
        if (warp + p * {warps} < S)
            wtile_async(tbase + (warp + p * {warps}) * TILE,
                        (const uint4*)(arena + (u64)vec_slots[r * {nv} + k] * NN + (bt0 - (1 << A_BITS)) * 256), lane);
    }
    if (warp < S && warp % F == 0)  // one warp a group
        wtile_table<WT>(wt, WARP_TABLE(tl_all, pi, G * tile + grp, WT), lane);
    if (SF < 8)
        for (int c = threadIdx.x; c < 120; c += blockDim.x) cp_async16(tl + 2 * c, TABLE_ROW(tl_all, pi, WT) + 2 * c);
    cp_async_commit();
{stage_copy}
    cp_async_wait<{pending}>();  // the tables; the staged operands (the last group) may be in flight
    __syncthreads();
    if (APART && warp >= S) return;
    if (BALANCE) {  // one group: unit u is the row pair u & 1 of slot u >> 1, the 2 S units dealt over the warps
#pragma unroll 1
        for (int u = warp; u < 2 * S; u += {warps}) {
            u32* sm = tbase + (u >> 1) * TILE;
            wpass<0, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q, u & 1, (u & 1) + 1);
            __syncwarp();
            wpass<4, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q, u & 1, (u & 1) + 1);
            __syncwarp();
        }
    } else {
#pragma unroll
        for (int p = 0; p < PW; ++p) {
            u32* sm = tbase + (warp + p * {warps}) * TILE;
            if (warp + p * {warps} < S) {
                wpass<0, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);
                __syncwarp();
                wpass<4, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);
            }
        }
    }
{stage_wait}
    if (!APART) __syncthreads();
    else if (F == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;" :: "r"(1 + warp / F), "r"(32 * F) : "memory");  // the group's F warps
{evaluate}
}
"""

# The program over the block's groups, 4 residues a thread (16-byte words): with APART, a group's F warps take its
# 256 words; else all threads take one of every group.
_EVAL_WORDS = r"""
    const int g0 = APART ? warp / F : 0, g1 = APART ? g0 + 1 : G, e0 = APART ? (warp % F) * 32 + lane : threadIdx.x;
#pragma unroll 1
    for (int g = g0; g < g1; ++g) {  // one group at a time (its operands' registers, not G groups')
        for (int e = e0; e < 256; e += APART ? 32 * F : 256) {
            const int i = (G * tile + g) * 256 + e;
            const u32* gs = tbase + g * F * TILE + wsidx(e >> 6, (e & 63) * 4);
{transformed}
{body}
        }
    }"""

# The program over the block's one group (G = 1), one residue a thread at a time (EpilogueConfig.scalar_from): point pe =
# 256 c + threadIdx.x of the group (row c of its tile), position j of the limb; a warp's loads and stores are 128
# contiguous bytes, and each operand holds one register, not four.
_EVAL_SCALAR = r"""
#pragma unroll 1
    for (int c = 0; c < 4; ++c) {
        const int pe = 256 * c + threadIdx.x, j = 1024 * tile + pe;
        const u32* gs = tbase + wsidx(c, threadIdx.x);
{transformed}
{body}
    }"""


def epilogue_groups(operands: int) -> int:
    """G: the groups of 4 rows a block of an epilogue kernel with ``operands`` transformed operands takes (F G row
    passes of :data:`EPILOGUE_WARPS` warps)."""
    return max(1, EPILOGUE_WARPS // operands)


def epilogue_smem(operands: int, config: EpilogueConfig, staged: int = 0) -> int:
    """Dynamic shared memory of an epilogue kernel with ``operands`` transformed operands (tl, a table wt a group and
    a warp tile for each of its F G row passes) and ``staged`` staged plain operands (4 KiB each,
    :func:`epilogue_staged`)."""
    g, wt = epilogue_groups(operands), warp_table_entries(split_stage(config.split_from))
    return 8 * 240 + g * 8 * wt + operands * g * 16 * WPITCH + 4096 * staged


def epilogue_fits(operands: int, blocks: int, config: EpilogueConfig) -> bool:
    """Whether ``blocks`` epilogue blocks with ``operands`` transformed operands (their tiles and tables; the staged
    operands take only the room left, :func:`epilogue_staged`) fit in a multiprocessor's shared memory."""
    return blocks * (epilogue_smem(operands, config) + 1024) <= SMEM_SM


def epilogue_scalar(operands: int, config: EpilogueConfig) -> bool:
    """Whether an epilogue kernel with ``operands`` transformed operands evaluates its program one residue a thread
    (_EVAL_SCALAR): with one group a block, from ``config.scalar_from`` operands."""
    return operands >= config.scalar_from and epilogue_groups(operands) == 1


def epilogue_weight(operands: int, n_vec: int, outputs: int, config: EpilogueConfig) -> float:
    """An epilogue module's relative compile time (a module of most families: 1), the order in which a batch of
    compiles starts it: ``1 + W / 32``, W the registers that its program's ``n_vec`` vector operands and ``outputs``
    outputs take, 4 each evaluated in 16-byte words and 1 each one residue a thread (:func:`epilogue_scalar`, with
    ``operands`` transformed operands). Register pressure is what makes a candidate spill, so that the module compiles
    its next candidate, up to three in a row: started first, those chains do not end a batch late."""
    return 1.0 + (n_vec + outputs) * (1 if epilogue_scalar(operands, config) else 4) / 32


def epilogue_staged(operands: tuple[int, ...], plain: tuple[int, ...], blocks: int,
                    config: EpilogueConfig) -> tuple[int, ...]:
    """The plain operands an epilogue kernel with transformed ``operands`` stages in shared memory (``stage``, 4 KiB
    each: its block's 256 16-byte words), copied with cp.async before its row passes and read by its program after
    them: with one group a block (the copy is one word a thread), the first of ``plain`` that fit beside its tiles
    with ``blocks`` blocks on a multiprocessor."""
    if epilogue_groups(len(operands)) != 1:
        return ()
    room = SMEM_SM // blocks - 1024 - epilogue_smem(len(operands), config)
    return tuple(plain[: max(0, room // 4096)])


def epilogue_source(logn: int, name: str, operands: tuple[int, ...], n_vec: int, body: str, lazy: bool,
                    params: str, min_blocks: int, staged: tuple[int, ...], config: EpilogueConfig,
                    helpers: str = "") -> str:
    """CUDA source of the _EPILOGUE kernel ``name`` (N = 2^logn >= 8192) whose vector operands ``operands`` (at most
    :data:`EPILOGUE_MAX`, ascending) are transformed; ``body`` reads the other operands, evaluates the program and
    stores (as the plain elementwise kernel's; the transformed operands are ``x{k}``: uint4, or u32 where
    :func:`epilogue_scalar`); ``lazy`` as the column kernel that wrote them; ``params``: the body's further kernel
    parameters (gathered operands'), after ``tiles``; ``min_blocks``: the resident blocks a multiprocessor its launch
    bounds ask; ``staged``: the plain operands copied to shared memory (:func:`epilogue_staged`; the body reads
    operand ``staged[j]`` at ``stage + 1024 j``: word ``e``, or point ``pe`` one residue a thread); ``helpers``:
    device functions the body calls."""
    if logn <= 12 or not 0 < len(operands) <= EPILOGUE_MAX:
        raise ValueError(f"an epilogue kernel needs N >= 8192 and 1 to {EPILOGUE_MAX} transformed operands")
    sf = split_stage(config.split_from)
    operand_of = " : ".join(f"f == {w} ? {k}" for w, k in enumerate(operands[:-1])) + (
        " : " if len(operands) > 1 else "") + str(operands[-1])
    if staged and epilogue_groups(len(operands)) != 1:
        raise ValueError("an epilogue kernel stages plain operands only with one group a block")
    copies = [f"    u32* stage = dyn + {epilogue_smem(len(operands), config) // 4};  // staged operand j at stage + 1024 j"]
    copies += [f"    cp_async16(stage + {1024 * j} + 4 * threadIdx.x, arena + (u64)vec_slots[r * {n_vec} + {k}] * NN"
               " + 4 * ((u64)tile * 256 + threadIdx.x));" for j, k in enumerate(staged)]
    stage_copy = "\n".join(copies) + "\n    cp_async_commit();" if staged else ""
    reads = []
    scalar = epilogue_scalar(len(operands), config)
    for w, k in enumerate(operands):
        if scalar:
            reads += [f"        const u32 x{k} = fwd_final(gs[{w} * TILE], q, two_q, m32);"]
            continue
        reads += [f"            uint4 x{k} = *(const uint4*)(gs + {w} * TILE);"]
        reads += [f"            x{k}.{c} = fwd_final(x{k}.{c}, q, two_q, m32);" for c in "xyzw"]
    evaluate = fill(_EVAL_SCALAR if scalar else _EVAL_WORDS, transformed="\n".join(reads), body=body)
    kernel = fill(_EPILOGUE, name=name, sf=sf, sft=min(sf, 6), f=len(operands), operand_of=operand_of, nv=n_vec,
                  evaluate=evaluate, params=params, min_blocks=min_blocks, warps=EPILOGUE_WARPS,
                  threads=32 * EPILOGUE_WARPS, g=epilogue_groups(len(operands)), stage_copy=stage_copy,
                  pending=int(bool(staged)),
                  stage_wait="    cp_async_wait<0>();  // this thread's staged operands" if staged else "")
    return header(logn, logn - ROW_LOG, lazy) + helpers + kernel
