#!/usr/bin/env bash
# A same-call baseline for device timings: the tree of an earlier commit beside the working tree, so that one device
# call times both on one GPU (timings compare only within one call or one warm machine: docs/PERFORMANCE.md).
#
#   here:       bash scripts/gpu_ab.sh prepare REV   # REV's tracked files into .ab/ (git-ignored), with a manifest
#   the device: bash scripts/gpu_ab.sh run CMD ...   # CMD in .ab/ (PYTHONPATH's "." is then REV's tree), e.g.
#               bash scripts/gpu_ab.sh run python3 scripts/gpu_bench.py --fused-only --streams 1,4
#
# GPU_AB_DIR (default .ab; a folder of the repository root) names the copy, so that one call can time several
# earlier commits (GPU_AB_DIR=.ab2 bash scripts/gpu_ab.sh prepare REV2, and the same variable with run).
#
# Carry .ab with the call (`run`'s carry: [".ab", ".data", ".whl", ...]). The copy to the device may leave a file of
# .ab/ that equals the working tree's as a dangling link: `run` copies the working tree's file in its place and
# checks every file of .ab/ against the manifest first (exit 2 on a difference). .ab/.data and .ab/.whl point to the
# working tree's.
set -euo pipefail
ab=${GPU_AB_DIR:-.ab}
manifest=.manifest
case "${1:-}" in
prepare)
    rev=${2:?usage: gpu_ab.sh prepare REV}
    git rev-parse --verify -q "$rev^{commit}" > /dev/null || { echo "gpu_ab.sh: no commit $rev" >&2; exit 2; }
    rm -rf "$ab"
    mkdir -p "$ab"
    git archive "$rev" | tar -x -C "$ab"
    (cd "$ab" && find . -type f ! -name "$manifest" -print0 | sort -z | xargs -0 sha256sum > "$manifest")
    git rev-parse --short "$rev" > "$ab/.rev"
    exclude="$(git rev-parse --git-path info/exclude)"
    grep -qx "/$ab/" "$exclude" 2> /dev/null || echo "/$ab/" >> "$exclude"
    echo "$ab/ holds $(cat "$ab/.rev") ($(wc -l < "$ab/$manifest") files); carry it with the device call"
    ;;
run)
    shift
    [ $# -gt 0 ] || { echo "usage: gpu_ab.sh run CMD [ARGS...]" >&2; exit 2; }
    [ -f "$ab/$manifest" ] || { echo "gpu_ab.sh: no $ab/$manifest: run 'gpu_ab.sh prepare REV' first" >&2; exit 2; }
    while IFS= read -r -d '' link; do
        src=${link#"$ab"/}
        [ -f "$src" ] || { echo "gpu_ab.sh: $link is a dangling link and $src does not exist" >&2; exit 2; }
        rm -f "$link"
        cp "$src" "$link"
    done < <(find "$ab" -xtype l ! -name .data ! -name .whl -print0)
    (cd "$ab" && sha256sum --quiet -c "$manifest" >&2) || { echo "gpu_ab.sh: $ab/ differs from its manifest" >&2; exit 2; }
    for d in .data .whl; do
        if [ -e "$d" ] && [ ! -e "$ab/$d" ]; then ln -s "../$d" "$ab/$d"; fi
    done
    cd "$ab"
    exec "$@"
    ;;
*)
    echo "usage: gpu_ab.sh prepare REV | run CMD [ARGS...]" >&2
    exit 2
    ;;
esac
