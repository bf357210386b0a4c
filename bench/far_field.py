"""The blocked graph's influence message per site, with the far field summed (each site gets the basis on
its own rows) against the message with the whole basis that it replaced (docs/scale.md).

    nice -n 10 .venv/bin/python -m bench.far_field [--n 20000] [--json bench/results/far_field.json]

A plaintext blocked job (`run_xclp`, the defaults: ε = 5·10⁻⁴, r = 192) over bench.scale's data (Fashion-MNIST,
10 sites, Dirichlet 0.5, 10 % labelled, L = 1024). For every site: the bytes of the message it was sent
(`CoordinatorSession.influence_message`) and of the same columns with the whole n × r basis (what it was
sent before), both encoded by `encode_sparse_columns`.
"""

from __future__ import annotations

import argparse
import json
import time


def measure(n: int, seed: int = 0) -> dict:
    from bench.scale import dataset, params
    from xclp.far_field import encode_sparse_columns
    from xclp.protocol import CoordinatorSession
    from xclp.simulation import run_xclp
    from xclp.wire import dump_bundle

    sent: dict[str, dict] = {}
    original = CoordinatorSession.influence_message

    def recording(self, site):
        body = original(self, site)
        whole = dump_bundle({"layout": self.layout.encode(), **encode_sparse_columns(self.influence[site])})
        sent[site] = {"n_j": int(self.layout.sizes[self.layout.sites.index(site)]), "bytes": len(body),
                      "bytes_whole_basis": len(whole), "rank": int(self.influence[site].coef.shape[0])}
        return body

    ds = dataset(n, seed)
    CoordinatorSession.influence_message = recording
    try:
        t0 = time.perf_counter()
        run_xclp(ds, params("blocked"), seed=seed)
        seconds = time.perf_counter() - t0
    finally:
        CoordinatorSession.influence_message = original
    return {"n": n, "seconds": round(seconds, 1), "sites": sent,
            "total_bytes": sum(v["bytes"] for v in sent.values()),
            "total_bytes_whole_basis": sum(v["bytes_whole_basis"] for v in sent.values())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    out = measure(a.n, a.seed)
    for s, v in out["sites"].items():
        print(f"{s}: n_j = {v['n_j']:,}, {v['bytes'] / 1e6:.1f} MB (the whole basis: {v['bytes_whole_basis'] / 1e6:.1f} MB)")
    print(f"all sites: {out['total_bytes'] / 1e6:.1f} MB (the whole basis: {out['total_bytes_whole_basis'] / 1e6:.1f} MB)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
