#!/usr/bin/env bash
# The client's figures of record on one GPU, in one call (from the repository root, with .data/ holding
# corpus/ and BootstrapLike_51L.tar.xz):
#   0. imports: the fixed cost of a process (imports, CUDA context);
#   1. tests: the client's GPU tests (PCG64 words on the device, transfers, key store, batched client);
#   2. client: scripts/gpu_client_check.py on every 4L/10L program (GPU client == CPU client, bit for
#      bit), then BootstrapLike_51L_1c at N = 65536: GPU client keys + inputs (target 5 s), the first
#      keys again on the CPU (compared), a key store written and loaded;
#   3. digest: scripts/gpu_setup_profile.py --digest (reference inputs on the GPU client, output digest
#      against scripts/reference_digests.json);
#   4. `caramel run` of BootstrapLike_51L_1c end to end with --json (timings_s): cold (empty load, plan
#      and schedule caches; CuPy's kernel cache filled by the steps before), again (caches filled),
#      `caramel keys`, then `--keys` three times (KEYS_RUNS=R: R times); the digests
#      must be equal (the same seed, keys generated or loaded) and equal session 5's;
#      scripts/gpu_client_startup.py first; NOWARM=1: also --keys with CARAMEL_GPU_WARMUP=0;
#      BYTECODE=1: also --keys with caramel's sources compiled (the device image writes no bytecode);
#      each run's process wall time (start to exit, with user + system CPU seconds) in $out/NAME.wall;
#   5. with GPU_TESTS=1: tests/execute/test_gpu.py (the executor);
#   6. with PROFILE=1: scripts/gpu_client_runprofile.py on a --keys run (cProfile, `-v` lines: the GPU
#      warm-up's steps) and the same run launched eagerly instead of captured (--eager), each under a
#      time limit (a hang dumps the stacks and ends the step).
# Logs go to $OUT (or ./gpu_e2e_logs); a summary is printed last. Exit status 1 if any step failed.
set -u
out="${OUT:-gpu_e2e_logs}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CARAMEL_CACHE="$(mktemp -d)"
big=".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c"
source "$(dirname "$0")/gpu_step.sh"
step imports python3 -c "
import sys, time
t = [time.perf_counter()]
import numpy; t.append(time.perf_counter())
import cupy; t.append(time.perf_counter())
cupy.zeros(1).sum(); cupy.cuda.Device().synchronize(); t.append(time.perf_counter())
import caramel.cli, caramel.api, caramel.execute.cuda_graph, caramel.backends.cuda.backend; t.append(time.perf_counter())
print('import numpy %.3f s, cupy %.3f s, CUDA context and first kernel %.3f s, caramel (plan, executor) %.3f s' % tuple(b - a for a, b in zip(t, t[1:])))"
step tests python3 -m pytest -q -rs tests/ckks/test_pcg.py tests/ckks/test_device.py tests/ckks/test_keystore.py \
    tests/backends/test_cuda_transfer.py
step client python3 scripts/gpu_client_check.py .data/corpus --bootstrap "$big"
step digest python3 scripts/gpu_setup_profile.py "$big" --digest
export CARAMEL_CACHE="$(mktemp -d)"  # run-cold: empty load, plan and schedule caches; the later runs find them filled
walled() {  # walled COMMAND... --json F.json ...: the command's wall, user and system seconds (bash's `time`) into F.wall
    local f="" prev="" a
    for a in "$@"; do [ "$prev" = --json ] && f="${a%.json}.wall"; prev=$a; done
    local TIMEFORMAT='%R %U %S'
    { time "$@" 2>&3; } 3>&2 2> "${f:-/dev/null}"
}
run=(walled python3 -m caramel run "$big" --n 65536 --backend gpu)
step startup python3 scripts/gpu_client_startup.py
step run-cold "${run[@]}" --json "$out/run-cold.json"
step run-again "${run[@]}" --json "$out/run-again.json"
step keys python3 -m caramel keys "$big" --n 65536 --out /tmp/caramel-ks
step run-keys "${run[@]}" --keys /tmp/caramel-ks --json "$out/run-keys.json"
keyruns=(run-keys)
for i in $(seq 2 "${KEYS_RUNS:-3}"); do  # KEYS_RUNS=R: R runs with --keys (default 3)
    step "run-keys$i" "${run[@]}" --keys /tmp/caramel-ks --json "$out/run-keys$i.json"
    keyruns+=("run-keys$i")
done
if [ -n "${NOWARM:-}" ]; then
    CARAMEL_GPU_WARMUP=0 step run-keys-nowarm "${run[@]}" --keys /tmp/caramel-ks --json "$out/run-keys-nowarm.json"
fi
if [ -n "${BYTECODE:-}" ]; then  # the device image writes no bytecode; an installed package has it compiled
    step compile python3 -m compileall -q caramel
    step run-keys-pyc "${run[@]}" --keys /tmp/caramel-ks --json "$out/run-keys-pyc.json"
fi
if [ -n "${PROFILE:-}" ]; then  # where a --keys run's seconds go (cProfile; -v: the warm-up's steps)
    step profile timeout 200 python3 scripts/gpu_client_runprofile.py "$big" --keys /tmp/caramel-ks --out "$out/profile"
    step profile-eager timeout 100 python3 scripts/gpu_client_runprofile.py "$big" --keys /tmp/caramel-ks \
        --out "$out/profile-eager" --eager --no-profile
fi
[ -n "${GPU_TESTS:-}" ] && step gpu-tests python3 -m pytest -q -rs tests/execute/test_gpu.py  # the executor
# The digest of seed 0 with no check file (scripts/reference_digests.json holds the bench draws' digest).
want=8440161b3e9ddf468d46ca8bc5ad3d433b129c784d35fd3ce1e51c3c4f17ee6f
for f in run-cold run-again "${keyruns[@]}"; do
    d=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$out/$f.json" 2>/dev/null)
    if [ "$d" = "$want" ]; then summary+=("$f digest = $want (session 5's)"); else summary+=("$f digest '$d' DIFFERS"); status=1; fi
done
d1=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$out/run-cold.json" 2>/dev/null)
d2=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$out/run-keys.json" 2>/dev/null)
if [ -n "$d1" ] && [ "$d1" = "$d2" ]; then summary+=("run-cold digest = run-keys digest ($d1)"); else summary+=("digests differ: '$d1' '$d2'"); status=1; fi
for f in run-cold run-again "${keyruns[@]}" run-keys-nowarm run-keys-pyc; do
    [ -f "$out/$f.json" ] || continue
    summary+=("$f: $(python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['timings_s']; w=open(sys.argv[2]).read().split() or ['nan'] * 3; print(' '.join(f'{k} {v:.2f}' for k, v in t.items()), '| sum %.2f' % sum(t.values()), '| keys+encrypt %.2f' % (t['keys'] + t['encrypt']), '| process wall %.2f (user+sys %.2f)' % (float(w[0]), float(w[1]) + float(w[2])))" "$out/$f.json" "$out/$f.wall" 2>&1)")
done
for f in imports tests client digest startup run-cold keys run-keys profile profile-eager gpu-tests; do
    [ -f "$out/$f.txt" ] || continue
    echo "=== $f"; tail -n 16 "$out/$f.txt"
done
echo "=== summary"; printf '%s\n' "${summary[@]}"
exit $status
