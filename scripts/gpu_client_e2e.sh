#!/usr/bin/env bash
# The client's figures of record on one GPU, in one call (from the repository root, with .data/ holding
# corpus/ and BootstrapLike_51L.tar.xz; the relevant part of scripts/gpu_e2e.sh plus the setup profile):
#   1. scripts/gpu_setup_profile.py twice, with an empty CuPy kernel cache, then with the one it filled:
#      first CUDA use, keys, inputs, plan, the executor's setup phases, kernel modules compiled or loaded;
#      the second also runs the reference inputs and compares the digest with scripts/reference_digests.json;
#   2. scripts/gpu_client_check.py on the 10L one-chip programs (GPU client == CPU client, bit for bit);
#   3. `caramel run` of BootstrapLike_51L_1c end to end (empty load and plan caches), `caramel keys`,
#      `caramel run --keys` twice (load and plan caches filled); the digests must be equal (the same
#      seed, keys generated or loaded).
#   0. first: the fixed cost of a process (imports, CUDA context), step "imports".
# Logs go to $OUT (or ./gpu_e2e_logs); a summary is printed last. Exit status 1 if any step failed.
set -u
out="${OUT:-gpu_e2e_logs}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CARAMEL_CACHE="$(mktemp -d)"
export CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-$(mktemp -d)}"
big=".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c"
source "$(dirname "$0")/gpu_step.sh"
step imports python3 -c "
import sys, time
t = [time.perf_counter()]
import numpy; t.append(time.perf_counter())
import cupy; t.append(time.perf_counter())
cupy.zeros(1).sum(); cupy.cuda.Device().synchronize(); t.append(time.perf_counter())
import caramel.cli, caramel.api, caramel.execute.cuda_graph, caramel.backends.cuda.backend; t.append(time.perf_counter())
print('import numpy %.3f s, cupy %.3f s, CUDA context and first kernel %.3f s, caramel (plan, networkx, executor) %.3f s' % tuple(b - a for a, b in zip(t, t[1:])))
print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix)"
step setup-cold python3 scripts/gpu_setup_profile.py "$big"
step setup-warm python3 scripts/gpu_setup_profile.py "$big" --digest
step client python3 scripts/gpu_client_check.py .data/corpus --pattern '*_10L_1c'
export CARAMEL_CACHE="$(mktemp -d)"  # run-cold: empty load and plan caches; the later runs find them filled
step run-cold python3 -m caramel run "$big" --n 65536 --backend gpu --json "$out/run-cold.json"
step keys python3 -m caramel keys "$big" --n 65536 --out /tmp/caramel-ks
step run-keys python3 -m caramel run "$big" --n 65536 --backend gpu --keys /tmp/caramel-ks --json "$out/run-keys.json"
step run-keys2 python3 -m caramel run "$big" --n 65536 --backend gpu --keys /tmp/caramel-ks --json "$out/run-keys2.json"
d1=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$out/run-cold.json" 2>/dev/null)
d2=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$out/run-keys.json" 2>/dev/null)
if [ -n "$d1" ] && [ "$d1" = "$d2" ]; then summary+=("run-cold digest = run-keys digest"); else summary+=("digests differ: '$d1' '$d2'"); status=1; fi
for f in imports setup-cold setup-warm client run-cold keys run-keys run-keys2; do
    echo "=== $f"; tail -n 14 "$out/$f.txt"
done
echo "=== summary"; printf '%s\n' "${summary[@]}"
exit $status
