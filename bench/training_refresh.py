"""Cost of one secure XCLP refresh inside FedAvg+XCLP, and the accuracy effect of refreshing every R rounds.

    .venv/bin/python -m bench.training_refresh [--quick] [--part 1|2|all] [--json OUT]
    .venv/bin/python -m bench.training_refresh --crypto lattice [--quick] [--per-site 500] [--rounds 10] [--json OUT]

Part 1. Fashion-MNIST, 20 sites × 1,000 points (seeded 20k subset), 1,000 labels; the MLP is trained
for a few labelled-only FedAvg rounds, then the server samples 5 sites (as a FedAvg+XCLP round does)
and their 128-d embeddings are the XCLP input (~5,000 points). run_xclp is timed on exactly that
round's data for crypto = plaintext (full size), ot and paillier (L = 1024, 2048-bit keys). The
secure protocols are too slow at 5,000 points on this machine, so they are run on seeded per-site
subsamples of that round's data at two sizes, next to plaintext on the same subsamples (labels
compared), and their Hamming-phase seconds and bytes *beyond plaintext's* are fitted as a + b·P,
P = Σ_{site pairs} n_a·n_b (the cross-site point pairs the secure Hamming protocol covers), then
extrapolated to the full round: EXTRAPOLATED, labelled as such in the output.

Part 2. FedAvg+XCLP (plaintext) with refresh R = 1, 2, 5: same seed, data, sites, rounds. Records
final / best accuracy, pseudo-label accuracy, how many XCLP runs actually happened (a round also
refreshes when a sampled site has no cached labels yet) and their seconds; combines the refresh
count with part 1's per-refresh costs into an implied secure cost per round.

`--crypto C` (e.g. lattice; replaces parts 1 and 2, default output bench/results/training_refresh_C.json).
A protocol fast enough to run at a round's real size, measured, not extrapolated:
(a) one refresh: part 1's round data (5 sampled sites' 128-d embeddings after 3 labelled-only FedAvg
rounds), --per-site points a site (default 500: 2,500 points), L = 1024; run_xclp timed with plaintext
and with C on exactly the same data and seed, alternately, --repeats times each (labels compared);
target: C's median ≤ 5× plaintext's median. (b) The R = 1 training run end to end: FedAvg+XCLP on
Fashion-MNIST, 10 sites × --per-site points (50 labels a site), 5 sites a round, 5 local epochs,
--rounds rounds (default 10), one XCLP run every round (5 sites: 2,500 points at the default), timed
with crypto = C and with plaintext (same seed; an exact protocol gives the same pseudo-labels, hence
the same accuracy curve).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from xclp.data import make_dataset
from xclp.job_params import JobParams
from xclp.simulation import run_xclp
from xclp.training import simulation as sim_mod
from xclp.training.fedavg import FedAvgConfig, sample_sites
from xclp.training.models import embed_array
from xclp.training.runner import TrainConfig, prepare, run_training
from xclp.training.simulation import run_fedavg

RESULTS = Path(__file__).resolve().parent / "results" / "training_refresh.json"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- part 1 ----------------------------------------------------------------------------------------

def round_data(quick: bool, seed: int = 0, warm_rounds: int = 3):
    """(X, y, site, y_true) of one FedAvg+XCLP round: 5 sampled sites' embeddings after a few rounds."""
    cfg = TrainConfig(algorithm="fedavg", dataset="fashion-mnist", sites=20, split="iid", labels=1000,
                      train_size=20_000, test_size=2000, seed=seed, quiet=True)
    if quick:
        cfg.train_size, cfg.labels = 4000, 200
    sites, _, test, n_classes = prepare(cfg)
    fc = FedAvgConfig(algorithm="fedavg", rounds=warm_rounds, sites_per_round=5, local_epochs=2 if quick else 5,
                      seed=seed, threads=1)
    out = run_fedavg(sites, test, n_classes, fc)
    model = out["model"]
    rng = np.random.default_rng(seed + 1)
    by_name = {s.name: s for s in sites}
    chosen = sample_sites([s.name for s in sites if s.n_labelled > 0], [s.name for s in sites if s.n_labelled == 0],
                          5, rng)
    V = [embed_array(model, by_name[s].X) for s in chosen]
    info = {"warm_rounds": warm_rounds, "warm_accuracy": out["final_accuracy"], "sites": chosen,
            "points": int(sum(len(v) for v in V)), "embedding_dim": int(V[0].shape[1]),
            "labels": int(sum(by_name[s].n_labelled for s in chosen))}
    data = [(v, by_name[s].y, by_name[s].y_true, s) for v, s in zip(V, chosen)]
    return data, n_classes, info


def subsample(data, per_site: int | None, seed: int = 0):
    Xs, ys, ts, ss = [], [], [], []
    rng = np.random.default_rng(seed)
    for v, y, yt, s in data:
        idx = np.arange(len(y)) if per_site is None or per_site >= len(y) else np.sort(
            rng.choice(len(y), per_site, replace=False))
        yy = y[idx].copy()
        if (yy >= 0).sum() == 0:  # keep at least one label per site (as the full round has)
            lab = np.flatnonzero(y >= 0)
            idx[0] = lab[0]
            idx = np.sort(idx)
            yy = y[idx].copy()
        Xs.append(v[idx]), ys.append(yy), ts.append(yt[idx]), ss.append(np.full(len(idx), s))
    sizes = [len(y) for y in ys]
    P = sum(a * b for i, a in enumerate(sizes) for b in sizes[i + 1:])
    ds = make_dataset(np.concatenate(Xs), np.concatenate(ys), np.concatenate(ss), y_true=np.concatenate(ts),
                      n_classes=10)
    return ds, sizes, P


def time_xclp(ds, crypto: str, bits: int, key_bits: int, seed: int = 0) -> dict:
    params = JobParams(job_id="fedavg-round-refresh", n_classes=10, bits=bits, k=10, alpha=0.99, crypto=crypto,
                       key_bits=key_bits).validate()
    t0 = time.perf_counter()
    res = run_xclp(ds, params, seed=seed)
    wall = time.perf_counter() - t0
    unl = (ds.y < 0) & (ds.y_true >= 0)
    return {"crypto": crypto, "seconds": wall, "timings": {k: float(v) for k, v in res.timings.items()},
            "bytes": {"total": int(res.bytes["total"]), "by_phase": {k: int(v) for k, v in res.bytes["by_phase"].items()}},
            "pseudo_label_accuracy": float(np.mean(res.labels[unl] == ds.y_true[unl])),
            "_labels": res.labels, "_conf": res.confidence}


def fit_line(xs, ys):
    """a + b·x through the points (least squares; exact through two)."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def part1(quick: bool, bits: int, key_bits: int, sizes: list[int], protocols: list[str]) -> dict:
    t0 = time.perf_counter()
    data, n_classes, info = round_data(quick)
    say(f"part 1: round data {info}")
    full, full_sizes, full_P = subsample(data, None)
    out = {"round": info, "bits": bits, "key_bits": key_bits, "full": {"sizes": full_sizes, "P": full_P}}
    r = time_xclp(full, "plaintext", bits, key_bits)
    say(f"plaintext full ({full.n} points): {r['seconds']:.2f}s, {r['bytes']['total']:,} B")
    out["full"]["plaintext"] = {k: v for k, v in r.items() if not k.startswith("_")}
    subs = []
    for per_site in sizes:
        ds, sz, P = subsample(data, per_site, seed=per_site)
        row = {"per_site": per_site, "n": int(ds.n), "P": P, "runs": {}}
        ref = None
        for crypto in ["plaintext"] + protocols:
            r = time_xclp(ds, crypto, bits, key_bits)
            if ref is None:
                ref = r
            r["labels_identical_to_plaintext"] = bool(np.array_equal(r["_labels"], ref["_labels"]))
            r["max_confidence_diff"] = float(np.max(np.abs(r["_conf"] - ref["_conf"])))
            row["runs"][crypto] = {k: v for k, v in r.items() if not k.startswith("_")}
            say(f"  {crypto} n={ds.n} (P={P:,}): {r['seconds']:.2f}s, {r['bytes']['total']:,} B, "
                f"identical={r['labels_identical_to_plaintext']}")
        subs.append(row)
        out["subsamples"] = subs
        _save_partial({"part1": out})
    # extrapolation of the hamming phase beyond plaintext, linear in P
    pt_full = out["full"]["plaintext"]
    extra = {}
    for crypto in protocols:
        Ps = [row["P"] for row in subs]
        dt = [row["runs"][crypto]["timings"]["hamming"] - row["runs"]["plaintext"]["timings"]["hamming"] for row in subs]
        db = [row["runs"][crypto]["bytes"]["by_phase"].get("hamming", 0)
              - row["runs"]["plaintext"]["bytes"]["by_phase"].get("hamming", 0) for row in subs]
        other_dt = [row["runs"][crypto]["timings"]["total"] - row["runs"][crypto]["timings"]["hamming"]
                    - (row["runs"]["plaintext"]["timings"]["total"] - row["runs"]["plaintext"]["timings"]["hamming"])
                    for row in subs]
        at, bt = fit_line(Ps, dt)
        ab, bb = fit_line(Ps, db)
        ham_s = pt_full["timings"]["hamming"] + at + bt * full_P
        # the other phases (setup incl. key generation, seed, counts, graph, influence, row_sums) are
        # taken from plaintext at full size plus the largest subsample's secure extra (key generation)
        other_extra = other_dt[-1]
        phases = dict(pt_full["timings"])
        phases["hamming"] = ham_s
        phases["setup"] = phases.get("setup", 0.0) + max(other_extra, 0.0)
        total = sum(v for p, v in phases.items() if p != "total")
        phases["total"] = total
        tot_bytes = pt_full["bytes"]["total"] + ab + bb * full_P
        extra[crypto] = {"EXTRAPOLATED": True, "fit_seconds_per_pair": bt, "fit_seconds_const": at,
                         "fit_bytes_per_pair": bb, "fit_bytes_const": ab, "other_phase_extra_seconds": other_extra,
                         "timings": phases, "seconds": total, "bytes_total": tot_bytes,
                         "ratio_seconds_to_plaintext": total / pt_full["seconds"],
                         "ratio_bytes_to_plaintext": tot_bytes / pt_full["bytes"]["total"]}
        say(f"  {crypto} extrapolated to {full.n} points: {total:.0f}s ({total / pt_full['seconds']:.0f}× plaintext), "
            f"{tot_bytes / 1e9:.2f} GB")
    out["extrapolated_full"] = extra
    out["seconds"] = time.perf_counter() - t0
    return out


# --- part 2 ----------------------------------------------------------------------------------------

class _Counter:
    """Wraps the simulation's XCLP child-job runner to count the XCLP runs and their seconds."""

    def __init__(self):
        self.calls, self.seconds, self.rounds = 0, 0.0, []
        self._orig = sim_mod._run_child

    def __enter__(self):
        counter = self

        def wrapped(run, job, seed):
            t = time.perf_counter()
            out = counter._orig(run, job, seed)
            counter.seconds += time.perf_counter() - t
            counter.calls += 1
            counter.rounds.append(int(job.round))
            return out

        sim_mod._run_child = wrapped
        return self

    def __exit__(self, *exc):
        sim_mod._run_child = self._orig


def timed_training(cfg: TrainConfig) -> tuple[dict, _Counter, float, list, list]:
    """(result, its XCLP counter, wall seconds, accuracy curve, pseudo-label accuracy curve) of one run."""
    with _Counter() as c:
        t0 = time.perf_counter()
        out = run_training(cfg)
        wall = time.perf_counter() - t0
    h = out["history"]
    accs = [x["accuracy"] for x in h if x.get("accuracy") is not None]
    pseudo = [x["pseudo_label_accuracy"] for x in h if x.get("pseudo_label_accuracy") is not None]
    return out, c, wall, accs, pseudo


def part2(quick: bool, refreshes: list[int], rounds: int, sites: int, seed: int = 0) -> dict:
    base = dict(algorithm="fedavg-xclp", dataset="fashion-mnist", sites=sites, split="iid", labels=50 * sites,
                train_size=1000 * sites, test_size=2000, rounds=rounds, sites_per_round=5, local_epochs=5,
                bits=1024, crypto="plaintext", seed=seed, quiet=True, threads=1)
    if quick:
        base.update(sites=10, labels=200, train_size=2000, rounds=4, local_epochs=1, test_size=500)
    runs = []
    for R in refreshes:
        out, c, wall, accs, pseudo = timed_training(TrainConfig(refresh=R, **base))
        row = {"refresh": R, "rounds": len(out["history"]), "final_accuracy": out["final_accuracy"], "best_accuracy": max(accs),
               "pseudo_label_accuracy_mean": float(np.mean(pseudo)), "pseudo_label_accuracy_last": pseudo[-1],
               "xclp_runs": c.calls, "xclp_rounds": c.rounds, "xclp_seconds": c.seconds, "seconds": wall,
               "xclp_bytes": out["communication_bytes"]["xclp_bytes"],
               "accuracy_curve": accs, "pseudo_curve": pseudo}
        say(f"part 2: R={R}: final {row['final_accuracy']:.4f} best {row['best_accuracy']:.4f} "
            f"pseudo {row['pseudo_label_accuracy_mean']:.4f}, {c.calls} XCLP runs ({c.seconds:.1f}s), {wall:.0f}s")
        runs.append(row)
        _save_partial({"part2": {"config": base, "runs": runs}})
    return {"config": base, "runs": runs}


def implied_costs(p1: dict | None, p2: dict | None) -> list[dict]:
    if not p1 or not p2:
        return []
    pt = p1["full"]["plaintext"]
    per = {"plaintext": (pt["seconds"], pt["bytes"]["total"], False)}
    for crypto, e in p1.get("extrapolated_full", {}).items():
        per[crypto] = (e["seconds"], e["bytes_total"], True)
    rows = []
    for r in p2["runs"]:
        frac = r["xclp_runs"] / r["rounds"]
        for crypto, (s, b, ext) in per.items():
            rows.append({"refresh": r["refresh"], "crypto": crypto, "xclp_runs_per_round": frac,
                         "seconds_per_round": frac * s, "bytes_per_round": frac * b, "extrapolated": ext})
    return rows


# --- --crypto C: one measured secure refresh and the R = 1 training run ------------------------------

def secure_refresh(quick: bool, crypto: str, per_site: int, repeats: int, bits: int = 1024,
                   key_bits: int = 2048) -> dict:
    """(a): plaintext and `crypto` alternately on the same subsample of one round's data."""
    data, n_classes, info = round_data(quick)
    say(f"{crypto} refresh: round data {info}")
    ds, sizes, P = subsample(data, per_site, seed=per_site)
    runs: dict[str, list[dict]] = {"plaintext": [], crypto: []}
    for i in range(repeats):
        for c in ("plaintext", crypto):
            r = time_xclp(ds, c, bits, key_bits)
            runs[c].append(r)
            say(f"  {c} #{i + 1} ({ds.n} points, P = {P:,}): {r['seconds']:.2f} s "
                f"(hamming {r['timings']['hamming']:.2f} s), {r['bytes']['total']:,} B")
    ref = runs["plaintext"][0]
    out = {"round": info, "bits": bits, "per_site": per_site, "n": int(ds.n), "sizes": sizes, "P": P,
           "repeats": repeats, "runs": {}}
    for c, rs in runs.items():
        secs = [r["seconds"] for r in rs]
        out["runs"][c] = {
            "seconds": secs, "median_seconds": float(np.median(secs)), "min_seconds": float(min(secs)),
            "hamming_seconds": [r["timings"]["hamming"] for r in rs],
            "timings_median_run": {k: v for k, v in sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2]["timings"].items()},
            "bytes": rs[0]["bytes"], "pseudo_label_accuracy": rs[0]["pseudo_label_accuracy"],
            "labels_identical_to_plaintext": all(np.array_equal(r["_labels"], ref["_labels"]) for r in rs),
            "max_confidence_diff": float(max(np.max(np.abs(r["_conf"] - ref["_conf"])) for r in rs))}
    pt, sc = out["runs"]["plaintext"], out["runs"][crypto]
    out["ratio_median"] = sc["median_seconds"] / pt["median_seconds"]
    out["ratio_min"] = sc["min_seconds"] / pt["min_seconds"]
    out["target_ratio"] = 5.0
    out["pass"] = out["ratio_median"] <= out["target_ratio"]
    say(f"{crypto} refresh: median {sc['median_seconds']:.2f} s vs plaintext {pt['median_seconds']:.2f} s "
        f"({out['ratio_median']:.1f}×; min/min {out['ratio_min']:.1f}×)")
    return out


def secure_training(quick: bool, crypto: str, per_site: int, rounds: int, seed: int = 0) -> dict:
    """(b): the R = 1 FedAvg+XCLP run end to end with `crypto`, and with plaintext (same seed)."""
    sites = 10
    base = dict(algorithm="fedavg-xclp", dataset="fashion-mnist", sites=sites, split="iid", labels=50 * sites,
                train_size=per_site * sites, test_size=2000, rounds=rounds, sites_per_round=5, local_epochs=5,
                refresh=1, bits=1024, seed=seed, quiet=True, threads=1)
    if quick:
        base.update(rounds=2, local_epochs=1, test_size=500)
    out = {"config": base, "runs": {}}
    for c in (crypto, "plaintext"):
        res, cnt, wall, accs, pseudo = timed_training(TrainConfig(crypto=c, **base))
        out["runs"][c] = {"seconds": wall, "rounds": len(res["history"]), "xclp_runs": cnt.calls, "xclp_seconds": cnt.seconds,
                          "seconds_without_xclp": wall - cnt.seconds, "final_accuracy": res["final_accuracy"],
                          "accuracy_curve": accs, "pseudo_curve": pseudo,
                          "xclp_bytes": res["communication_bytes"]["xclp_bytes"]}
        say(f"R = 1 training, {c}: {wall:.1f} s end to end ({cnt.calls} XCLP runs, {cnt.seconds:.1f} s), "
            f"final accuracy {res['final_accuracy']:.4f}")
    a, b = out["runs"][crypto], out["runs"]["plaintext"]
    out["ratio"] = a["seconds"] / b["seconds"]
    out["same_accuracy_curve"] = a["accuracy_curve"] == b["accuracy_curve"]
    return out


def secure_table(out: dict) -> str:
    c, r, t = out["crypto"], out["refresh"], out["training"]
    pt, sc = r["runs"]["plaintext"], r["runs"][c]
    ta, tb = t["runs"][c], t["runs"]["plaintext"]
    return "\n".join([
        f"| measurement | plaintext | {c} | {c} / plaintext |",
        "|---|---:|---:|---:|",
        f"| one refresh, {r['n']:,} points (5 sites × {r['per_site']}), L = {r['bits']}: seconds, median of "
        f"{r['repeats']} | {pt['median_seconds']:.2f} | {sc['median_seconds']:.2f} | **{r['ratio_median']:.2f}×** "
        f"(target ≤ {r['target_ratio']:g}×: **{'PASS' if r['pass'] else 'FAIL'}**) |",
        f"| same, fastest of {r['repeats']} | {pt['min_seconds']:.2f} | {sc['min_seconds']:.2f} | {r['ratio_min']:.2f}× |",
        f"| same, hamming phase (median run) | {pt['timings_median_run']['hamming']:.2f} | "
        f"{sc['timings_median_run']['hamming']:.2f} | – |",
        f"| same, bytes | {pt['bytes']['total']:,} | {sc['bytes']['total']:,} | "
        f"{sc['bytes']['total'] / pt['bytes']['total']:.1f}× |",
        f"| same, labels identical to plaintext | – | {'yes' if sc['labels_identical_to_plaintext'] else 'NO'} | – |",
        f"| R = 1 training ({t['config']['sites']} sites × {r['per_site']}, 5 a round, {ta['rounds']} rounds): "
        f"seconds end to end | {tb['seconds']:.1f} | {ta['seconds']:.1f} | {t['ratio']:.2f}× |",
        f"| same, of which XCLP ({ta['xclp_runs']} runs) | {tb['xclp_seconds']:.1f} | {ta['xclp_seconds']:.1f} | "
        f"{ta['xclp_seconds'] / tb['xclp_seconds']:.2f}× |",
        f"| same, final test accuracy | {tb['final_accuracy']:.4f} | {ta['final_accuracy']:.4f} | "
        f"same curve: {'yes' if t['same_accuracy_curve'] else 'no'} |",
    ])


def run_secure(args) -> int:
    t0 = time.perf_counter()
    per_site = 100 if args.quick else args.per_site
    flags = [f"--crypto {args.crypto}"] + (["--quick"] if args.quick else []) + \
        [f"--{k.replace('_', '-')} {v}" for k, v, d in (("per_site", args.per_site, 500), ("repeats", args.repeats, 3),
                                                       ("rounds", args.rounds, None), ("seed", args.seed, 0)) if v != d]
    out = {"crypto": args.crypto, "command": "python -m bench.training_refresh " + " ".join(flags)}
    _save_partial(out)
    _save_partial({"refresh": secure_refresh(args.quick, args.crypto, per_site, args.repeats)})
    _save_partial({"training": secure_training(args.quick, args.crypto, per_site, args.rounds or 10, args.seed)})
    _save_partial({"seconds": time.perf_counter() - t0})
    print(secure_table(_STATE))
    say(f"wrote {_OUT[0]}")
    return 0


# --- main ------------------------------------------------------------------------------------------

_STATE: dict = {}
_OUT = [RESULTS]


def _save_partial(update: dict) -> None:
    _STATE.update(update)
    _OUT[0].parent.mkdir(parents=True, exist_ok=True)
    _OUT[0].write_text(json.dumps(_STATE, indent=1, default=float))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default=None, help="per-site subsample sizes for the secure runs, e.g. 100,200")
    ap.add_argument("--protocols", default="ot,paillier")
    ap.add_argument("--rounds", type=int, default=None, help="training rounds (default 20; 10 with --crypto)")
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--refresh", default="1,2,5")
    ap.add_argument("--seed", type=int, default=0, help="part 2 seed")
    ap.add_argument("--merge", nargs="*", default=[], help="JSON files of separate parts to merge into --json")
    ap.add_argument("--crypto", default=None, help="instead of parts 1 and 2: one measured refresh with this protocol "
                                                   "(e.g. lattice) against plaintext, and the R = 1 training run with it")
    ap.add_argument("--per-site", type=int, default=500, help="with --crypto: points a site (default 500)")
    ap.add_argument("--repeats", type=int, default=3, help="with --crypto: timed refreshes per protocol")
    args = ap.parse_args(argv)
    if args.crypto is not None:
        from xclp.job_params import CRYPTO_CHOICES

        if args.crypto not in CRYPTO_CHOICES or args.crypto == "plaintext":
            ap.error(f"--crypto must be a secure protocol, one of {[c for c in CRYPTO_CHOICES if c != 'plaintext']}")
        default = Path(f"/tmp/training_refresh_{args.crypto}_quick.json") if args.quick else \
            RESULTS.with_name(f"training_refresh_{args.crypto}.json")
        _OUT[0] = Path(args.json) if args.json else default
        return run_secure(args)
    args.rounds = 20 if args.rounds is None else args.rounds
    _OUT[0] = Path(args.json) if args.json else (Path("/tmp/training_refresh_quick.json") if args.quick else RESULTS)
    if args.merge:
        for f in args.merge:  # a later part 1 replaces an earlier one (kept aside); further part 2 runs (other seeds) are kept
            d = json.loads(Path(f).read_text())
            if "part1" in d:
                if "part1" in _STATE:
                    _STATE.setdefault("part1_earlier_runs", []).append(_STATE["part1"])
                _STATE["part1"] = d["part1"]
            if "part2" in d:
                if "part2" in _STATE:
                    _STATE.setdefault("part2_other_seeds", []).append(d["part2"])
                else:
                    _STATE["part2"] = d["part2"]
        _save_partial({"implied_secure_cost": implied_costs(_STATE.get("part1"), _STATE.get("part2"))})
        return 0
    sizes = [int(s) for s in (args.sizes or ("10,20" if args.quick else "100,200")).split(",")]
    protocols = [p for p in args.protocols.split(",") if p]
    if args.part in ("1", "all"):
        _save_partial({"part1": part1(args.quick, 1024, 2048, sizes, protocols)})
    if args.part in ("2", "all"):
        _save_partial({"part2": part2(args.quick, [int(r) for r in args.refresh.split(",")], args.rounds, args.sites, args.seed)})
    _save_partial({"implied_secure_cost": implied_costs(_STATE.get("part1"), _STATE.get("part2"))})
    say(f"wrote {_OUT[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
