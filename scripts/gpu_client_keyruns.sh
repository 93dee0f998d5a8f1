#!/usr/bin/env bash
# `caramel run BIG --n 65536 --backend gpu --keys DIR --json F` several times, from one or more
# source trees in turn (interleaved, so that the machine's drift falls on every tree alike), with
# per run: the timings_s, their sum, the process wall (bash), and the exit (the seconds between
# `cli.main` returning and the process ending: the interpreter's and CUDA's teardown; through
# `cli.console`, the command's own exit, where the tree has it).
#
#   TREES="/path/a /path/b" RUNS=3 OUT=dir bash scripts/gpu_client_keyruns.sh
#
# From the repository root with .data/ (BootstrapLike_51L.tar.xz); the key store is made once in
# /tmp/caramel-ks (KS=...) unless it exists; every run's digest must be session 5's. Exit 1 if not.
set -u
out="${OUT:-gpu_keyruns_logs}"
mkdir -p "$out"
big="${BIG:-.data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c}"
ks="${KS:-/tmp/caramel-ks}"
trees=(${TREES:-$PWD})
want=8440161b3e9ddf468d46ca8bc5ad3d433b129c784d35fd3ce1e51c3c4f17ee6f
export PYTHONUNBUFFERED=1
base="${PYTHONPATH:-}"
if [ ! -f "$ks/manifest.json" ]; then
    PYTHONPATH="${trees[0]}${base:+:$base}" python3 -m caramel keys "$big" --n "${N:-65536}" --out "$ks" > "$out/keys.txt" 2>&1 \
        || { echo "caramel keys failed"; tail "$out/keys.txt"; exit 1; }
fi
# shellcheck disable=SC2016
wrapper='import os, sys, time
import caramel.cli as cli
inner = cli.main


def timed(argv=None):
    rc = inner(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    print("main returned %.6f" % time.time(), file=sys.stderr, flush=True)
    return rc


cli.main = timed
if hasattr(cli, "console"):  # the command exits as the caramel process does
    cli.console()
sys.exit(timed())'
status=0
lines=()
for i in $(seq 1 "${RUNS:-3}"); do
    for t in "${trees[@]}"; do
        name="$(basename "$t")-$i"
        t0=$(date +%s.%N)
        PYTHONPATH="$t${base:+:$base}" python3 -c "$wrapper" run "$big" --n "${N:-65536}" --backend "${BACKEND:-gpu}" --keys "$ks" \
            --json "$out/$name.json" ${ARGS:-} > "$out/$name.txt" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        lines+=("$(python3 - "$out/$name.json" "$out/$name.txt" "$t0" "$t1" "$rc" "$name" "$want" <<'EOF'
import json, re, sys
f, log, t0, t1, rc, name, want = sys.argv[1:]
try:
    doc = json.load(open(f))
except (OSError, ValueError) as e:
    print(f"{name}: rc {rc}, no JSON ({e})"); sys.exit()
t = doc["timings_s"]
m = re.findall(r"main returned ([0-9.]+)", open(log).read())
exit_s = float(t1) - float(m[-1]) if m else float("nan")
ok = "digest ok" if doc.get("digest") == want else f"DIGEST {doc.get('digest')}"
print(f"{name}: rc {rc} " + " ".join(f"{k} {v:.2f}" for k, v in t.items())
      + f" | sum {sum(t.values()):.2f} | wall {float(t1) - float(t0):.2f} | exit {exit_s:.2f} | {ok}")
EOF
)")
        [ "$rc" -eq 0 ] && grep -q "$want" "$out/$name.json" || status=1
    done
done
printf '%s\n' "${lines[@]}" | tee "$out/summary.txt"
exit $status
