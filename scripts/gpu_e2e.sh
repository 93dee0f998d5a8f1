#!/usr/bin/env bash
# The client, the key store, batches and the whole command line on one GPU, in one call (from the
# repository root, with .data/ holding corpus/ and BootstrapLike_51L.tar.xz):
#   1. scripts/gpu_client_check.py: GPU client == CPU client on every 4L/10L program; BootstrapLike_51L_1c's
#      keys and inputs at N = 65536 timed on the GPU; its key store written and loaded;
#   2. `caramel run` of BootstrapLike_51L_1c end to end: cold (empty load cache), warm, and with stored keys;
#   3. scripts/gpu_batch.py: a batch of 4 instances, each digest against a single run, and the throughput;
#   4. scripts/gpu_corpus_check.py in textbook and emulator modes (exact: scripts/gpu_all.sh).
# Logs go to $OUT (or ./gpu_e2e_logs); a summary is printed last. Exit status 1 if any step failed.
set -u
out="${OUT:-gpu_e2e_logs}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CARAMEL_CACHE="$(mktemp -d)"
big=".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c"
source "$(dirname "$0")/gpu_step.sh"
step client python3 scripts/gpu_client_check.py .data/corpus --bootstrap "$big" --store /tmp/caramel-ks-check
step run-cold python3 -m caramel run "$big" --n 65536 --backend gpu --json "$out/run-cold.json"
step run-warm python3 -m caramel run "$big" --n 65536 --backend gpu --json "$out/run-warm.json"
step keys python3 -m caramel keys "$big" --n 65536 --out /tmp/caramel-ks
step run-keys python3 -m caramel run "$big" --n 65536 --backend gpu --keys /tmp/caramel-ks --json "$out/run-keys.json"
step batch python3 scripts/gpu_batch.py --batch 4 --gpus 1 --throughput 1 --json "$out/batch.json"
for mode in textbook emulator; do
    step "corpus-$mode" python3 scripts/gpu_corpus_check.py .data/corpus --n 4096,65536 --workers 14 --mode "$mode"
done
for f in client run-cold run-warm keys run-keys batch corpus-textbook corpus-emulator; do
    echo "=== $f"; tail -n 12 "$out/$f.txt"
done
echo "=== summary"; printf '%s\n' "${summary[@]}"
exit $status
