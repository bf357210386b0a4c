"""`xclp plan`: what a prediction job will cost (xclp/plan.py holds the model and its measured rates)."""

from __future__ import annotations

import json
from pathlib import Path

from crypto.hamming_api import DEFAULT_SECURE, PROTOCOLS


def _size(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1000 or unit == "TB":
            return f"{b:,.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1000
    return ""


def _duration(s: float) -> str:
    return f"{s:,.1f} s" if s < 120 else f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.1f} h"


def cmd_plan(args) -> int:
    from xclp.plan import plan_job

    sizes = None
    if args.site_points:
        try:
            sizes = [int(x) for x in args.site_points.split(",")]
        except ValueError:
            raise ValueError(f"--site-points {args.site_points!r}: give comma-separated whole numbers") from None
    p = plan_job(args.points, args.sites, args.crypto, args.bits, args.labelled_fraction, args.classes,
                 args.features, sizes)
    if args.json:
        Path(args.json).write_text(json.dumps(p.to_json(), indent=2))
    print(f"a prediction job over {p.points:,} points in {p.sites} sites, crypto={p.crypto}, L={p.bits}, "
          f"{p.labelled:,} labelled, {p.classes} classes, {p.features} features")
    print(f"  pairs across sites (SecureHamming): {p.cross_pairs:,}")
    print(f"  time: {_duration(p.total_seconds)} in process, about {_duration(p.service_seconds)} through a "
          f"coordinator and agents")
    print("    " + ", ".join(f"{k} {_duration(v)}" for k, v in p.seconds.items()))
    sent = p.bytes_per_site.values()
    print(f"  bytes per site (sent and received): {_size(min(sent))} to {_size(max(sent))}; "
          f"{_size(p.bytes_total)} in all")
    print(f"  coordinator memory: about {_size(p.coordinator_memory_bytes)}")
    print("  (estimates from the rates measured on 2 shared cores: xclp/plan.py, docs/operating.md)")
    return 0


def add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="what a prediction job will cost: time, bytes per site, coordinator memory")
    pl.add_argument("--points", type=int, required=True, help="all sites' points together (n)")
    pl.add_argument("--sites", type=int, required=True, help="number of sites (m); equal sites unless --site-points")
    pl.add_argument("--site-points", default=None, help="each site's points, comma-separated (summing to --points; "
                    "default: equal sites)")
    pl.add_argument("--crypto", choices=PROTOCOLS, default=DEFAULT_SECURE,
                    help="the Hamming protocol whose measured rates the estimate uses")
    pl.add_argument("--bits", type=int, default=1024, help="LSH length L (default 1024)")
    pl.add_argument("--labelled-fraction", type=float, default=0.1, help="labelled share of the points (default 0.1)")
    pl.add_argument("--classes", type=int, default=10, help="number of classes C (the row sums' width)")
    pl.add_argument("--features", type=int, default=784, help="features per point (LSH's cost; default 784)")
    pl.add_argument("--json", type=Path, default=None, help="write the estimate as JSON to this file (default: none)")
    pl.set_defaults(func=cmd_plan)
