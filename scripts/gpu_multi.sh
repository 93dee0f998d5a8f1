#!/usr/bin/env bash
# Several GPUs of one host, in one or two calls (from the repository root, with .data/ holding corpus/
# and BootstrapLike_51L.tar.xz). `bash scripts/gpu_multi.sh PART` with PART:
#   a: NCCL health (scripts/nccl_probe.py), the multi-GPU test modules with their skips listed,
#      process mode (`caramel launch --nproc G`) of BootstrapLike_51L_2c against the same program on
#      G GPUs in one process (digests must match), and a batch of BootstrapLike_51L_1c over 1..G GPUs;
#   b: scripts/gpu_multi_bench.py (every 10L K-chip program on min(K, G) GPUs against the CPU reference,
#      BootstrapLike_51L_4c/_8c on G GPUs against the stored reference digests, the 1..G scaling table,
#      PNG and trace) and the compute floor per device.
# Logs go to /tmp/caramel-multi, packed into $OUT/multi-PART.tar.gz; a summary is printed last.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CARAMEL_PROGRAMS="${CARAMEL_PROGRAMS:-$PWD/.data/corpus}" CARAMEL_CACHE="$(mktemp -d)"
part=${1:-a}
out=/tmp/caramel-multi/$part
mkdir -p "$out"
gpus=$(python3 -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())')
counts=$(python3 -c "print(','.join(str(1 << i) for i in range(4) if 1 << i <= $gpus))")  # 1,2,4,8: the chip counts compiled
big=".data/BootstrapLike_51L.tar.xz"
source "$(dirname "$0")/gpu_step.sh"
if [ "$part" = a ]; then
    step probe bash -c "nvidia-smi topo -m; python3 scripts/nccl_probe.py --nproc $gpus && python3 scripts/nccl_probe.py --nproc $gpus --graph"
    step tests timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/execute/test_multi_gpu.py \
        tests/execute/test_rebind.py tests/execute/test_distributed.py
    step launch timeout 200 python3 -m caramel launch --nproc 2 -- run "$big#BootstrapLike_51L_2c" --n 65536 \
        --backend gpu --seed 1
    step threads timeout 200 python3 -m caramel run "$big#BootstrapLike_51L_2c" --n 65536 --backend gpu --gpus 2 \
        --seed 1
    step same-digest bash -c "grep -h 'output digest' $out/launch.txt $out/threads.txt | uniq -c | tee /dev/stderr | awk '{n += \$1} END {exit !(NR == 1 && n == 2)}'"
    step batch timeout 300 python3 scripts/gpu_batch.py --batch 4 --gpus "$gpus" --throughput "$counts" --rounds 2 \
        --json "$out/batch.json"
else
    step multi timeout 420 python3 scripts/gpu_multi_bench.py --gpus "$counts" --max-only --repeats 10 --out "$out"
    step floor timeout 120 python3 scripts/gpu_multi_bench.py --gpus "$counts" --compute-floor --repeats 10
fi
for f in "$out"/*.txt; do echo "=== $(basename "$f")"; tail -n 25 "$f"; done
tar czf "${OUT:-/tmp}/multi-$part.tar.gz" -C /tmp/caramel-multi "$part"
echo "=== summary"; printf '%s\n' "${summary[@]}"
exit $status
