"""Where a key store's load onto the GPU goes (one GPU): `python3 scripts/gpu_client_keystore.py STORE
[--n 65536]`. Times, each twice, synchronised: the whole load (`load_keys(on_device=True)`), the c0
files alone (read into pinned buffers, hashed, copied up, range-checked: 16 threads), and the seeded
c1 draws alone (`_device_redraws`: one thread)."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("store")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    import cupy as cp

    from caramel.ckks import keystore
    from caramel.ckks.keys import key_limbs
    from caramel.ring import Context

    ctx = Context(n=args.n)
    root = Path(args.store)
    manifest = keystore.read_manifest(root)
    digests = manifest["sha256"]
    states = keystore._a_states(root, manifest, digests, root / keystore.MANIFEST)
    entries = [(keystore._key_id(e["id"], root), e) for e in manifest["keys"]]
    items = [(key_limbs(kid), keystore._a_state(e, states, kid, root)) for kid, e in entries]
    cp.zeros(1).sum()

    def c0(entry):
        kid, e = entry
        limbs = key_limbs(kid)
        return keystore._device_load(root, e["c0"], digests, np.asarray(ctx.moduli(limbs), dtype=np.uint32).reshape(-1, 1),
                                     ctx.n)

    for attempt in (1, 2):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        ks = keystore.load_keys(root, ctx, on_device=True)
        cp.cuda.Device().synchronize()
        whole = time.perf_counter() - t
        del ks
        t = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(c0, entries))
        cp.cuda.Device().synchronize()
        files = time.perf_counter() - t
        del got
        t = time.perf_counter()
        got = [f.result() for f in keystore._device_redraws(ctx, items)]
        cp.cuda.Device().synchronize()
        draws = time.perf_counter() - t
        del got
        print(f"load {attempt}: whole {whole:.3f} s, c0 files alone {files:.3f} s, {len(items)} c1 draws alone "
              f"{draws:.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
