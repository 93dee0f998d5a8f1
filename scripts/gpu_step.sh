# Shared by scripts/gpu_all.sh and scripts/gpu_e2e.sh (source it): `step NAME COMMAND...` runs the
# command with its output in "$out/NAME.txt", adds a line (name, exit code, seconds) to the array
# `summary`, and sets `status=1` when the command fails.
status=0
summary=()
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    summary+=("$(printf '%-22s rc=%d  %4ds' "$name" "$rc" $((SECONDS - t0)))")
    [ "$rc" -eq 0 ] || status=1
}
