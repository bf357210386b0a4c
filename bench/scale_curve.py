"""Time and peak memory against n, 10^4 → 10^6 points (issue 23): the blocked pipeline in plaintext,
exact XCLP where it fits, and the secure (lattice) blocked job from measured per-block rates.

    nice -n 10 .venv/bin/python -m bench.scale_curve [--sizes 10000 20000 50000 100000 200000 500000 1000000]
        [--exact-max-n 20000] [--secure-n 1000] [--json bench/results/scale_curve.json]
        [--plot docs/scale_curve.png]
    .venv/bin/python -m bench.scale_curve --table bench/results/scale_curve.json   # the Markdown table

Data: `bench.synthetic.clustered` — 50 sites of n/50 points, 128-d, 10 classes of 20 anisotropic
clusters on a curved 16-d manifold, 5 % label noise, 1 % labelled, class mix Dir(0.5) per site (how
it is made: that module's docstring). L = 1024, k = 10, the blocked defaults (64 tables, cap 48,
2 NN-Descent rounds, push ε = 5·10⁻⁴, spectral rank 192) unless `--rank` says otherwise.

Each measurement runs in a fresh process and its row is appended to the JSON as soon as it is done (a
long run leaves what it measured). Memory, two numbers: `peak_bytes`, this process's peak RSS
(ru_maxrss), and for the blocked mode `peak_tree_pss_bytes`, the peak of the PSS summed over this
process and its pool workers, sampled every 0.5 s (bench.tree_memory; per step in
`tree_pss_phases`). The second is what the machine holds for the job: forked workers share the
parent's pages copy-on-write, RSS counts such a page in every process, PSS once. `peak_worker_bytes`
is the largest single worker's PSS peak (sampled); ru_maxrss of RUSAGE_CHILDREN, which counted the
inherited pages, is no longer reported. Modes:

- blocked: the blocked job's steps in plaintext (`blocked_pipeline`): the sites' sessions (setup, seed,
  counts with federated standardisation, LSH, tags, within-site lists, codes), the coordinator's
  candidates group by group, NN-Descent, graph, push + spectral influence (xclp.blocked_graph,
  xclp.blocking, xclp.push), then every point's scores Σ_j S_j Y_j and each site's labels. It is
  `xclp.simulation.run_xclp` (the job's machines) without the per-site messages of the influence and row-sum
  phases (in one process they would hold 50 copies of the n × r basis: 77 GB at 10^6): the labels
  are the same (tests/xclp/test_scale_curve.py); the bytes those messages carry are computed from
  the sizes and reported on paper (`bytes_per_site`).
- exact: `run_xclp` with graph="exact" (all pairs, the one order) up to --exact-max-n.
- lattice: `run_xclp` with crypto="lattice" at --secure-n points (10 sites): seconds and bytes per
  measured pair of the per-block protocol runs; the secure time at each n is then the plaintext
  blocked time + pairs(n) × the measured seconds per pair (pre-packing rates: each block is one
  protocol run).
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SITES = 50


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu() -> float:
    """CPU seconds of this process (user + system): on cores shared with other jobs, wall time says
    how loaded the machine was; this says what the work itself cost."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)  # an executor's pool workers, once they have ended
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def params(graph: str = "blocked", crypto: str = "plaintext", rank: int | None = None):
    from xclp.job_params import JobParams

    kw = {} if rank is None else {"influence_rank": rank}
    return JobParams(job_id="scale-curve", n_classes=10, bits=1024, graph=graph, crypto=crypto, **kw)


def _picklable_copy(sess):
    c = copy.copy(sess)
    for name, value in vars(sess).items():
        try:
            pickle.dumps(value)
        except (TypeError, pickle.PicklingError):
            setattr(c, name, None)
    return c


def _site_graph_steps(_, sess) -> tuple:
    """A site's graph steps before the coordinator's (an executor task): its codes, its tags message
    and its within-site lists message."""
    bits = sess.hash()
    return bits, sess.tags_message(), sess.intra_knn_message()


def blocked_pipeline(ds, p, seed: int = 0, say=lambda msg: None, executor=None, memory=None) -> dict:
    """The plaintext blocked job's computation (see the module docstring); returns labels, timings
    (seconds per step), the coordinator, and the message sizes per site. `executor`: the
    coordinator's (xclp.executor; its candidate step runs its table groups there), with more than
    one worker also where the sites' LSH, tags and within-site lists run, all sites at once.
    `memory`: a running bench.tree_memory.TreeMemory; each step's peak PSS of the process tree goes
    into `tree_pss_phases`."""
    from xclp.announce import decode_roster, encode_roster
    from xclp.measured import split_by_site
    from xclp.propagation import label_matrix, predict_from_scores
    from xclp.protocol import CoordinatorSession, SiteSession, simulation_contribution, simulation_noise_seed

    timings: dict[str, float] = {}
    cpu_timings: dict[str, float] = {}  # CPU seconds per step: on shared cores wall time says how loaded they were
    tree_pss: dict[str, int] = {}  # the peak PSS of the process tree inside each step (with `memory`)
    clock = [time.perf_counter(), cpu()]

    def lap(name: str) -> None:
        now, c = time.perf_counter(), cpu()
        timings[name] = timings.get(name, 0.0) + now - clock[0]
        cpu_timings[name] = cpu_timings.get(name, 0.0) + c - clock[1]
        clock[0], clock[1] = now, c
        tree = ""
        if memory is not None:
            tree_pss[name] = max(tree_pss.get(name, 0), memory.phase_peak())
            tree = f", tree PSS peak in step {tree_pss[name] / 2**30:.2f} GiB"
        say(f"{name} done: {timings[name]:.1f} s, peak {peak() / 2**30:.2f} GB{tree}, cpu {cpu():.0f} s, "
            f"load {Path('/proc/loadavg').read_text().split()[0]}")

    rows = split_by_site(ds)
    sites = list(rows)
    sessions = {s: SiteSession(p, s, ds.X[idx], ds.y[idx], contribution=simulation_contribution(seed, s),
                               noise_seed=simulation_noise_seed(seed, s)) for s, idx in rows.items()}
    coord = CoordinatorSession(p, executor=executor)
    announces = {s: sess.announce() for s, sess in sessions.items()}
    for s, a in announces.items():
        coord.register(s, a)
    roster = encode_roster([announces[s] for s in coord.order])
    for sess in sessions.values():
        sess.set_roster(decode_roster(roster))
    outbox = {s: sess.seed_messages() for s, sess in sessions.items()}
    for s, sess in sessions.items():
        sess.receive_seed({peer: outbox[peer][s] for peer in sites if peer != s}, participants=sites)
    del outbox
    for s, sess in sessions.items():
        coord.receive_counts(s, sess.counts_message(sites))
    total = coord.counts_total(sites)
    for sess in sessions.values():
        sess.receive_counts(total)
    lap("setup")
    sizes: dict[str, dict[str, int]] = {s: {} for s in sites}
    if executor is not None and executor.workers > 1:
        # the sites' own steps at once, as on the sites' machines: each session's LSH, tags and
        # within-site lists (its own methods, in their order) in a worker, on a copy of the session
        # without what does not pickle (its key pair and AEAD ciphers, which these steps do not use:
        # were one used, the step would fail on None, not differ); the codes come back
        copies = [_picklable_copy(sess) for sess in sessions.values()]
        for (s, sess), (bits, tags, intra) in zip(sessions.items(),
                                                  executor.map_shared(_site_graph_steps, None, copies)):
            sess.bits = bits
            sizes[s]["tags"], sizes[s]["within_site_lists"] = len(tags), len(intra)
            coord.receive_tags(s, tags)
            coord.receive_intra_knn(s, intra)
        del copies
        lap("sites_lsh_tags_within_site_pool")
    else:
        for sess in sessions.values():
            sess.hash()
        lap("lsh")
        for s, sess in sessions.items():
            m = sess.tags_message()
            sizes[s]["tags"] = len(m)
            coord.receive_tags(s, m)
            sess._tag_cache = None  # the coordinator holds the tags now (this process holds both sides)
        lap("tags")
        for s, sess in sessions.items():
            m = sess.intra_knn_message()
            sizes[s]["within_site_lists"] = len(m)
            coord.receive_intra_knn(s, m)
            sess._tag_cache = None
        lap("within_site")
    for s, sess in sessions.items():
        m = sess.codes_message()
        sizes[s]["codes_plaintext"] = len(m)
        coord.receive_plaintext_codes(s, m)
    coord.measure_candidates(sites)
    lap("candidates")
    coord.blocked.tags = {}
    while coord.measure_descent(sites):
        say(f"descent round {coord.blocked.rounds_done}: {coord.blocked.pair_count():,} pairs measured")
    lap("descent")
    W = coord.build_graph(sites)
    lap("graph")
    coord.compute_influence(W)
    lap("influence")
    # Every point's scores Σ_j S_j Y_j = Σ_j x_j Y_j + U Σ_j c_j Y_j: what the secure row sums add up.
    n, C = ds.n, p.n_classes
    Z = np.zeros((n, C))
    cY = 0.0
    U = None
    for s in coord.layout.sites:
        sess, cols = sessions[s], coord.influence[s]
        Yj = label_matrix(sess.y_released[sess.labelled_rows], sess.global_counts, p.balanced)
        Z += np.asarray(cols.x @ Yj)
        cY = cY + cols.coef @ Yj
        U = cols.basis
        # the site's message (CoordinatorSession.influence_message): the basis on its own rows only; the
        # row sums carry the far field's r rows after the n score rows (xclp.far_field.far_field_rows)
        far = cols.coef.shape[0]
        sizes[s]["influence"] = (cols.x.nnz * 16 + (cols.x.shape[1] + 1) * 8 + sess.X.shape[0] * far * 8
                                 + cols.coef.size * 8)
        sizes[s]["row_sums_up"] = (n + far) * C * 8
        sizes[s]["row_sums_down"] = (sess.X.shape[0] + far) * C * 8
    # The secure sum adds fixed-point values on a 2^-frac_bits grid: the near field and the far field's
    # r × C total each (xclp.far_field.far_field_rows), then each site puts U[R_j]·Σ c_j Y_j + near back on the
    # grid; a score below it is 0 there (an unreached point, label −1).
    def grid(a):
        return np.round(a * 2.0**p.frac_bits) * 2.0**-p.frac_bits

    Z = grid(Z)
    if U is not None and U.shape[1]:
        Z = grid(Z + U @ grid(cY))
    labels = np.empty(n, dtype=np.int64)
    for s in coord.layout.sites:
        labels[rows[s]] = predict_from_scores(Z[coord.layout.rows(s)], sessions[s].y).labels
    lap("scores")
    timings["total"] = sum(timings.values())
    cpu_timings["total"] = sum(cpu_timings.values())
    return {"labels": labels, "timings": timings, "cpu_timings": cpu_timings, "tree_pss_phases": tree_pss,
            "coordinator": coord, "sizes": sizes}


def sampled_recall(ds, coord, p, samples: int = 500, seed: int = 1) -> float:
    """recall@k of the blocked lists for a random sample of points against all n (exact for them)."""
    from xclp.blocking import pair_hamming

    st = coord.blocked
    codes = np.concatenate([st.codes[s] for s in st.sites])
    n = codes.shape[0]
    lists = st.knn(st.sites)
    pts = np.random.default_rng(seed).choice(n, size=min(samples, n), replace=False)
    hits = 0
    every = np.arange(n)
    for q in pts:
        d = pair_hamming(codes, np.full(n, q), every).astype(np.int64)
        d[q] = 1 << 20
        key = d * (n + 1) + every
        best = np.argpartition(key, p.k)[: p.k]
        hits += np.intersect1d(best, lists.idx[q]).size
    return hits / (pts.size * p.k)


def one(n: int, mode: str, seed: int, rank: int | None, secure_sites: int, workers: int = 1) -> dict:
    from bench.synthetic import clustered
    from xclp.simulation import unlabelled_accuracy

    def say(msg):
        print(f"[{time.strftime('%H:%M:%S')}] n={n} {mode}: {msg}", file=sys.stderr, flush=True)

    load0 = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.perf_counter()
    if mode == "lattice":
        from xclp.simulation import run_xclp as run_blocked  # the blocked job through the machines

        ds = clustered(sites=secure_sites, per_site=n // secure_sites, seed=seed)
        plain = run_blocked(ds, params("blocked", "plaintext", rank), seed=seed)
        t1 = time.perf_counter()
        res = run_blocked(ds, params("blocked", "lattice", rank), seed=seed)
        seconds = time.perf_counter() - t1
        hb = res.bytes["by_phase"].get("hamming", 0)
        pairs = res.coordinator.blocked.pair_count()
        return {"n": n, "mode": mode, "sites": secure_sites, "seconds": seconds, "phases": res.timings,
                "plaintext_seconds": t1 - t0, "plaintext_phases": plain.timings, "pairs": pairs,
                "hamming_bytes": hb, "labels_equal_plaintext": float(np.mean(res.labels == plain.labels)),
                "seconds_per_pair": (res.timings["hamming"] - plain.timings["hamming"]) / max(pairs, 1),
                "bytes_per_pair": hb / max(pairs, 1), "peak_bytes": peak(), "cpu_seconds": cpu(), "load": load0}
    ds = clustered(sites=SITES, per_site=n // SITES, seed=seed)
    if mode == "exact":
        from xclp.simulation import run_xclp

        res = run_xclp(ds, params("exact", rank=rank), seed=seed)
        return {"n": n, "mode": mode, "seconds": time.perf_counter() - t0, "phases": res.timings,
                "peak_bytes": peak(), "cpu_seconds": cpu(), "accuracy": unlabelled_accuracy(ds, res.labels),
                "load": load0}
    p = params("blocked", rank=rank)
    from bench.tree_memory import TreeMemory
    from xclp.executor import make_executor

    with TreeMemory() as mem:
        mem.phase_peak()  # the data set's making is not a step
        with make_executor("serial" if workers < 2 else "process", workers) as ex:
            out = blocked_pipeline(ds, p, seed, say, ex, memory=mem)
    row = {"n": n, "mode": mode, "workers": workers, "seconds": time.perf_counter() - t0, "phases": out["timings"],
           "cpu_phases": out["cpu_timings"],
           "peak_bytes": peak(), "cpu_seconds": cpu(), "accuracy": unlabelled_accuracy(ds, out["labels"]),
           # PSS summed over this process and its pool workers (bench.tree_memory: shared pages once)
           "peak_tree_pss_bytes": mem.peak, "tree_pss_phases": out["tree_pss_phases"],
           # the largest single pool worker's PSS peak (sampled)
           "peak_worker_bytes": mem.peak_child,
           "pairs_measured": out["coordinator"].blocked.pair_count(), "influence_rank": p.influence_rank,
           "load": load0, "load_end": Path("/proc/loadavg").read_text().split()[:3],
           "bytes_per_site_max": {k: max(v[k] for v in out["sizes"].values()) for k in next(iter(out["sizes"].values()))}}
    say(f"done in {row['seconds']:.1f} s, peak {row['peak_bytes'] / 2**30:.2f} GB, process tree's PSS peak "
        f"{mem.peak / 2**30:.2f} GiB, accuracy {row['accuracy']:.2%}")
    row["recall_at_10_sampled"] = sampled_recall(ds, out["coordinator"], p)
    return row


def slope(ns, ts) -> float:
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0]) if len(ns) >= 2 else float("nan")


def secure_estimate(result: dict) -> list[dict]:
    """The lattice blocked job at each n from the measured seconds and bytes per pair (pre-packing)."""
    lat = [r for r in result["rows"] if r["mode"] == "lattice"]
    if not lat:
        return []
    spp, bpp = lat[-1]["seconds_per_pair"], lat[-1]["bytes_per_pair"]
    out = []
    for r in (r for r in result["rows"] if r["mode"] == "blocked"):
        pairs = r["pairs_measured"]
        out.append({"n": r["n"], "seconds": r["seconds"] + pairs * spp, "pair_bytes": pairs * bpp,
                    "pair_bytes_per_site": pairs * bpp / SITES})  # bpp counts what both sites of a pair send
    return out


def sites_seconds(ph: dict) -> float:
    """The sites' steps (LSH, tags, within-site lists): one after another, or in the pool (`--workers`)."""
    if "sites_lsh_tags_within_site_pool" in ph:
        return ph["sites_lsh_tags_within_site_pool"]
    return ph["lsh"] + ph["tags"] + ph["within_site"]


def table(result: dict) -> str:
    blocked = [r for r in result["rows"] if r["mode"] == "blocked"]
    exact = {r["n"]: r for r in result["rows"] if r["mode"] == "exact"}
    secure = {r["n"]: r for r in secure_estimate(result)}
    lines = ["| n | blocked plaintext: total (CPU) | LSH + tags + within-site | candidates + descent | graph | influence | "
             "peak (main process, RSS) | peak (process tree, PSS) | pairs measured (per point) | recall@10 (500 sampled) | accuracy | exact XCLP: total (CPU), peak, accuracy | "
             "lattice blocked, from per-pair rates: time, pair bytes per site |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in blocked:
        ph, n = r["phases"], r["n"]
        e, s = exact.get(n), secure.get(n)
        lines.append(
            f"| {n:,} | {r['seconds']:.1f} s ({r.get('cpu_seconds', float('nan')):.0f} s) | {sites_seconds(ph):.1f} s | "
            f"{ph['candidates'] + ph['descent']:.1f} s | {ph['graph']:.1f} s | {ph['influence']:.1f} s | "
            f"{r['peak_bytes'] / 2**30:.2f} GB | "
            + (f"{r['peak_tree_pss_bytes'] / 2**30:.2f} GB" if "peak_tree_pss_bytes" in r else "—")
            + f" | {r['pairs_measured']:,} ({r['pairs_measured'] / n:.0f}) | "
            f"{r.get('recall_at_10_sampled', float('nan')):.3f} | {r['accuracy']:.2%} | "
            + (f"{e['seconds']:.1f} s" + (f" ({e['cpu_seconds']:.0f} s)" if "cpu_seconds" in e else "")
               + f", {e['peak_bytes'] / 2**30:.2f} GB, "
               f"{e['accuracy']:.2%}" if e else "—") + " | "
            + (f"{s['seconds'] / 3600:.1f} h, {s['pair_bytes_per_site'] / 2**30:.1f} GiB" if s else "—") + " |")
    lines.append(f"\nFitted log-log slope of the blocked time vs n: {result.get('slope_blocked', float('nan')):.2f}"
                 f" (of its CPU seconds: {result.get('slope_blocked_cpu', float('nan')):.2f}; exact: "
                 f"{result.get('slope_exact', float('nan')):.2f}).")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode, label, style in (("blocked", "blocked, plaintext (measured)", "o-"),
                               ("exact", "exact all pairs, plaintext (measured)", "s-")):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if rows:
            ns = [r["n"] for r in rows]
            ax.loglog(ns, [r["seconds"] for r in rows], style,
                      label=f"{label}, slope {slope(ns, [r['seconds'] for r in rows]):.2f}")
    rows = [r for r in result["rows"] if r["mode"] == "blocked" and "cpu_seconds" in r]
    if rows:
        ns, cs = [r["n"] for r in rows], [r["cpu_seconds"] for r in rows]
        ax.loglog(ns, cs, "o:", label=f"blocked, plaintext: CPU seconds of the process, slope {slope(ns, cs):.2f}")
    sec = secure_estimate(result)
    if sec:
        ax.loglog([r["n"] for r in sec], [r["seconds"] for r in sec], "^--",
                  label="blocked, lattice (from measured per-pair rates, pre-packing)")
    ax.axhline(1800, color="grey", lw=0.8, ls=":")
    ax.text(ax.get_xlim()[0] * 1.1, 1900, "30 min", color="grey", fontsize=8)
    ax.set_xlabel("points n (50 sites, synthetic clustered, 1 % labelled)")
    ax.set_ylabel("seconds (2 shared cores)")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def finish(result: dict, a) -> None:
    blocked = [r for r in result["rows"] if r["mode"] == "blocked"]
    exact = [r for r in result["rows"] if r["mode"] == "exact"]
    result["slope_blocked"] = slope([r["n"] for r in blocked], [r["seconds"] for r in blocked])
    result["slope_exact"] = slope([r["n"] for r in exact], [r["seconds"] for r in exact])
    # CPU seconds: the slope that the other jobs' load on the shared cores does not bend
    timed = [r for r in blocked if "cpu_seconds" in r]
    result["slope_blocked_cpu"] = slope([r["n"] for r in timed], [r["cpu_seconds"] for r in timed])
    result["secure_estimate"] = secure_estimate(result)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
                                                             1_000_000])
    ap.add_argument("--exact-max-n", type=int, default=20_000)
    ap.add_argument("--secure-n", type=int, default=1_000, help="points of the measured lattice run (0: none)")
    ap.add_argument("--secure-sites", type=int, default=10)
    ap.add_argument("--rank", type=int, default=None, help="spectral rank (default: JobParams' default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1,
                    help="the coordinator's process pool for the candidate step (1: none, in this process)")
    ap.add_argument("--json", default="bench/results/scale_curve.json")
    ap.add_argument("--plot", default="docs/scale_curve.png")
    ap.add_argument("--append", action="store_true", help="add rows to the JSON instead of starting it again")
    ap.add_argument("--one", nargs=2, metavar=("N", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--table", metavar="JSON", help="print the Markdown table of a result (and redraw the plot)")
    a = ap.parse_args(argv)
    if a.table:
        result = json.loads(Path(a.table).read_text())
        a.json = a.table
        finish(result, a)  # the slopes and the estimate again, from the rows as they are
        if a.plot:
            plot(result, a.plot)
        print(table(result))
        return
    if a.one:
        print(json.dumps(one(int(a.one[0]), a.one[1], a.seed, a.rank, a.secure_sites, a.workers)))
        return
    command = "python -m bench.scale_curve " + " ".join(argv if argv is not None else sys.argv[1:])
    result = json.loads(Path(a.json).read_text()) if a.append and Path(a.json).exists() else {"rows": []}
    result.setdefault("commands", []).append(command)
    jobs = []
    for n in a.sizes:
        jobs += [(n, "blocked")] + ([(n, "exact")] if n <= a.exact_max_n else [])
    jobs += [(a.secure_n, "lattice")] if a.secure_n else []
    for n, mode in jobs:
        cmd = [sys.executable, "-m", "bench.scale_curve", "--one", str(n), mode, "--seed", str(a.seed),
               "--secure-sites", str(a.secure_sites), "--workers", str(a.workers)] + ([] if a.rank is None else ["--rank", str(a.rank)])
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"n={n} {mode}: failed (exit {done.returncode}); stopping", file=sys.stderr)
            break
        row = json.loads(done.stdout.strip().splitlines()[-1])
        result["rows"] = [r for r in result["rows"] if (r["n"], r["mode"]) != (n, mode)] + [row]
        finish(result, a)  # written after every row: a long run keeps what it measured
        print(json.dumps({k: v for k, v in row.items() if k not in ("phases", "cpu_phases", "plaintext_phases")}), file=sys.stderr,
              flush=True)
    result["rows"].sort(key=lambda r: (r["mode"], r["n"]))
    finish(result, a)
    if a.plot:
        plot(result, a.plot)
    print(table(result))


if __name__ == "__main__":
    main()
