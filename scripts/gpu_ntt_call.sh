#!/usr/bin/env bash
# One device call of the NTT work (session 8): variants (bit-exact, then timed), the NTT GPU tests, the
# BootstrapLike_51L_1c replay on 4 streams with its digest and the batched NTT, optionally with the NTT module
# settings of NTT_SETS (each "NAME=V,NAME=V"; a replay per set, in one process, on STREAMS streams (default 4;
# "1,4" adds the roofline of each set)), the variants' further batch sizes MORE_ROWS, the test modules of
# EXTRA_TESTS and, with CORPUS=1, the exact corpus check.
# Usage (repository root, .data present): OUT=dir VARIANTS=1,8 MORE_ROWS=40,200 NTT_SETS="default SECOND_REVERSED=0" CORPUS=1 \
#     bash scripts/gpu_ntt_call.sh
set -u
out="${OUT:-gpu_ntt_logs}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/smi.txt"
git_rev=$(cat .commit 2>/dev/null || echo unknown); echo "tree $git_rev"
if [ -n "${VARIANTS:-}" ]; then
    python3 scripts/gpu_variants.py --sizes 4096,8192,65536 --ntt-only --ntt-variants "$VARIANTS" \
        --more-rows "${MORE_ROWS:-40}" > "$out/variants.txt" 2>&1
    echo "variants rc $?"; grep -E "checks|^\| (ntt|intt|  ntt)" "$out/variants.txt" | tail -80
fi
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
python3 -m pytest -q -p no:cacheprovider $xdist tests/backends/test_cuda_kernels.py -k ntt \
    tests/backends/test_cuda_ntt_prologue.py > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -n 3 "$out/tests.txt"
if [ -n "${EXTRA_TESTS:-}" ]; then  # e.g. "tests/execute/test_gpu.py tests/plan/test_cuda_plan.py"
    CARAMEL_PROGRAMS="${CARAMEL_PROGRAMS:-$PWD/.data/corpus}" python3 -m pytest -q -p no:cacheprovider $xdist \
        $EXTRA_TESTS > "$out/tests-extra.txt" 2>&1
    echo "extra tests rc $?"; tail -n 3 "$out/tests-extra.txt"
fi
sets=(); for set in ${NTT_SETS:-default}; do sets+=(--ntt-set "$set"); done
python3 scripts/gpu_bench.py --skip-reference --skip-checks --fused-only --repeats 10 --streams "${STREAMS:-4}" \
    "${sets[@]}" > "$out/bench.txt" 2>&1
echo "bench rc $?"; grep -E "^\| " "$out/bench.txt" | tail -40
if [ -n "${CORPUS:-}" ]; then
    python3 scripts/gpu_corpus_check.py .data/corpus --n 4096,65536 --workers 14 --mode exact > "$out/corpus.txt" 2>&1
    echo "corpus rc $?"; tail -n 2 "$out/corpus.txt"
fi
