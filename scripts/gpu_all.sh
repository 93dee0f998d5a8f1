#!/usr/bin/env bash
# Build, check and time the CUDA kernels in one call on a GPU machine (from the repository root):
#   1. scripts/gpu_bench.py: BootstrapLike_51L_1c at N = 65536 (replay times, digest against
#      scripts/reference_digests.json, NTT throughput, roofline per kernel kind);
#   1b. scripts/gpu_plan_bench.py: the same replay under the default plan, without sibling rows, without
#       automorphisms in their consumers' loads and without NTT epilogues;
#   1c. scripts/gpu_epilogue_bench.py: the NTT epilogue kernels against the two-pass NTT and plain kernel;
#   2. scripts/gpu_variants.py: NTT/INTT and base conversion kernels checked bit-exact against the
#      CPU reference on fresh random data (N = 4096, 8192, 65536) and timed, variants side by side;
#   3. the GPU test modules (tests/backends/test_cuda_kernels.py, test_cuda_ntt_prologue.py,
#      test_cuda_epilogue.py, test_cuda_twiddles.py, test_cuda_gather.py, tests/plan/test_cuda_plan.py,
#      tests/execute/test_gpu.py, tests/test_profile_roofline.py);
#   4. scripts/gpu_corpus_check.py over .data/corpus in the three arithmetic modes, N = 4096 and 65536.
# Logs go to $OUT (or ./gpu_all_logs); a summary is printed last. Exit status 1 if any step failed.
set -u
out="${OUT:-gpu_all_logs}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CARAMEL_PROGRAMS="${CARAMEL_PROGRAMS:-$PWD/.data/corpus}"  # the 10L programs of tests/execute/test_gpu.py
source "$(dirname "$0")/gpu_step.sh"
step bench python3 scripts/gpu_bench.py --skip-reference --skip-checks --repeats 10
step plans python3 scripts/gpu_plan_bench.py --repeats 10 --options "" --options max_outputs=1 \
    --options fuse_automorphism=False --options fuse_epilogue=False
step epilogue python3 scripts/gpu_epilogue_bench.py
step variants python3 scripts/gpu_variants.py --sizes 4096,8192,65536
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")  # pytest-xdist where the image has it
step tests python3 -m pytest -q -p no:cacheprovider $xdist tests/backends/test_cuda_kernels.py \
    tests/backends/test_cuda_ntt_prologue.py tests/backends/test_cuda_epilogue.py tests/backends/test_cuda_twiddles.py tests/backends/test_cuda_gather.py tests/plan/test_cuda_plan.py \
    tests/execute/test_gpu.py tests/test_profile_roofline.py
for mode in exact textbook emulator; do
    step "corpus-$mode" python3 scripts/gpu_corpus_check.py .data/corpus --n 4096,65536 --workers 14 --mode "$mode"
done
echo "=== bench (last lines)"; tail -n 32 "$out/bench.txt"
echo "=== plans"; tail -n 6 "$out/plans.txt"
echo "=== epilogue"; tail -n 14 "$out/epilogue.txt"
echo "=== variants (last lines)"; tail -n 40 "$out/variants.txt"
echo "=== tests"; tail -n 3 "$out/tests.txt"
for mode in exact textbook emulator; do tail -n 1 "$out/corpus-$mode.txt"; done
echo "=== summary"; printf '%s\n' "${summary[@]}"
exit $status
