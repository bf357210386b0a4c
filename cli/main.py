"""The `xclp` command line.

(About 1,050 lines: the parser of every command and the thin handlers that call into the packages, kept
in one file so that the whole command surface reads in one place; the work itself is elsewhere.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from cli.helpfmt import CLASSES_HELP
from cli.job_args import add_job_options
from crypto.hamming_api import PROTOCOLS as CRYPTO_CHOICES
from xclp.data import DataError
from xclp.job_options import JOB_OPTIONS, SECURE_DEFAULTS, TRAIN_JOB_OPTIONS

GRAPH_OPTIONS = ("graph", "blocking_tables", "max_bucket", "descent_rounds", "influence_rank")


def _add_graph_args(p: argparse.ArgumentParser) -> None:
    """The graph's flags, one set for `simulate predict` and `job submit predict`."""
    add_job_options(p, GRAPH_OPTIONS)


def _graph_params(args) -> dict:
    return {name: getattr(args, name) for name in GRAPH_OPTIONS}


def _add_predict_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", choices=["digits", "fashion-mnist", "mnist5k"], default=None,
                     help="a data set that installs offline (default: digits)")
    src.add_argument("--data", type=Path, help=".npz (X, y, site, optional y_true), .csv or .parquet (a label column, "
                     "empty or −1 = unlabelled, a site column, the rest features); default: --dataset's")
    _add_column_args(p)
    p.add_argument("--limit", type=int, default=None, help="use a seeded random subset of N points (default: all)")
    p.add_argument("--sites", type=int, default=5, help="number of simulated sites (default 5)")
    p.add_argument("--split", default="iid", help="iid or dirichlet:BETA (default iid)")
    p.add_argument("--labeled-fraction", type=float, default=0.1, help="labelled fraction per site (default 0.1)")
    p.add_argument("--unlabelled-sites", type=int, default=0,
                   help="how many sites (the last ones) hold no labels at all (default 0)")
    add_job_options(p, ("bits", "k", "alpha", "power", "standardize"))
    p.add_argument("--similarity", choices=["lsh", "exact"], default="lsh",
                   help="lsh (private) or exact cosine (plaintext reference only)")
    add_job_options(p, ("crypto", "key_bits"))  # plaintext by default: a simulation is the reference
    p.add_argument("--solver", choices=["auto", "cg", "minres", "dense"], default="auto",
                   help="linear solver for the influence columns (auto picks by size)")
    _add_graph_args(p)
    p.add_argument("--no-baselines", action="store_true", help="skip per-site and centralized LP")
    p.add_argument("--seed", type=int, default=0, help="fixes the split and the LSH hyperplanes")
    p.add_argument("--json", type=Path, help="write the results as JSON to this file (default: none)")
    p.add_argument("--predictions", type=Path, help="write labels and confidence (.npz, aligned with the rows; default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    dp = p.add_argument_group("label-DP of what the sums release (xclp/privacy/label_dp.py)")
    _label_dp_args(dp)
    dp.add_argument("--label-flip", type=float, default=None, help="rr's noise parameter p, instead of a budget (default: none)")
    dp.add_argument("--dp-noise", type=float, default=None, help="gaussian's noise multiplier z, instead of a budget (default: none)")
    dp.add_argument("--dp-clip", type=float, default=None,
                    help="gaussian: L2 bound C of each influence column over the other sites' rows (default 1)")


def label_dp_params(args, n_classes: int, jobs: int = 1) -> dict:
    """JobParams' label-DP fields from the flags: a budget calibrates the chosen mechanism."""
    from xclp.privacy import label_dp

    if args.dp_epsilon is not None and (args.label_flip is not None or args.dp_noise is not None):
        raise ValueError("give either --dp-epsilon or the noise itself (--label-flip / --dp-noise), not both")
    return label_dp.job_fields(n_classes, epsilon=args.dp_epsilon, delta=args.dp_delta, mechanism=args.label_dp,
                               flip=args.label_flip, noise=args.dp_noise, clip=args.dp_clip, jobs=jobs)


def _add_column_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label-column", default="label", help="CSV/Parquet: the label column (default label)")
    p.add_argument("--site-column", default="site", help="CSV/Parquet: the site column (default site)")
    p.add_argument("--truth-column", default="y_true",
                   help="CSV/Parquet: an optional ground-truth column, for scoring only (default y_true)")
    p.add_argument("--id-column", default=None, metavar="NAME",
                   help="a column of point IDs (e.g. a patient number): not a feature; an agent writes it beside "
                        "each point's label in its results (default: none, the id is the row's position)")
    p.add_argument("--ignore-columns", default=None, metavar="A,B,…",
                   help="comma-separated columns that are neither features nor labels, dropped on reading "
                        "(default: none, every other column is a feature)")
    p.add_argument("--schema", default=None, metavar="FILE",
                   help="the consortium's schema (JSON, xclp/schema.py): the table's features, their categories "
                        "(one-hot), fill values for missing cells, the label's class names; it names the label and "
                        "ID columns (default: none, every feature a number and the labels integers)")


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (ε, δ), else a clear usage error."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v > 0 and np.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return v


def _columns(args):
    from xclp.datafile import Columns, parse_column_list

    columns = Columns(label=args.label_column, site=args.site_column, truth=args.truth_column, id=args.id_column,
                      ignore=parse_column_list(args.ignore_columns))
    if getattr(args, "schema", None):
        from xclp.schema import Schema, with_schema

        columns = with_schema(columns, Schema.load(args.schema))
    return columns


def cmd_data_check(args) -> int:
    """Every problem of each file against the schema, one line each; exit 0 clean, 1 with problems."""
    from xclp.schema import Problems, prepare

    if not args.schema:
        raise DataError("xclp data check needs the consortium's --schema FILE (a draft: xclp data schema FILE "
                        "--label-column L)")
    columns = _columns(args)
    problems = Problems(keep=None if args.all else args.max_per_column)
    found = 0
    for path in args.files:
        before = len(problems)
        out, _ = prepare(path, columns.schema, columns, require_site=args.require_site, problems=problems)
        if out is not None:
            labelled = int((out["y"] >= 0).sum())
            print(f"{path}: ok: {out['X'].shape[0]} rows ({labelled} labelled), {out['X'].shape[1]} feature columns "
                  f"after the schema's encoding", file=sys.stderr)
        found += len(problems) - before
    for line in problems.lines():
        print(line)
    if found:
        print(f"xclp data check: {found} problem(s) in {len(args.files)} file(s)", file=sys.stderr)
    return 1 if found else 0


def cmd_data_schema(args) -> int:
    """A first schema from this site's file(s), for the consortium to agree on."""
    from xclp.datafile import parse_column_list
    from xclp.schema import draft

    d = draft(args.files, args.label_column, args.id_column, args.site_column, args.truth_column,
              parse_column_list(args.ignore_columns))
    text = json.dumps(d, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    print("xclp data schema: a DRAFT from your own file(s): it lists your site's categories and class names. "
          "Agree every list with the consortium (a data dictionary) and settle its _todo before the sites use it.",
          file=sys.stderr)
    return 0


def load_dataset(args):
    from xclp.data import load_arrays
    from xclp.datafile import dataset_from_file
    from xclp.splits import simulate_sites

    if args.data is not None:
        ds = dataset_from_file(args.data, _columns(args))
        if args.limit is not None and args.limit < ds.n:
            from xclp.data import make_dataset

            idx = np.sort(np.random.default_rng(args.seed).choice(ds.n, args.limit, replace=False))
            ds = make_dataset(ds.X[idx], ds.y[idx], ds.site[idx], None if ds.y_true is None else ds.y_true[idx])
        return ds, str(args.data)
    name = args.dataset or "digits"
    X, y = load_arrays(name, args.limit, args.seed)
    unl = tuple(range(args.sites - args.unlabelled_sites, args.sites)) if args.unlabelled_sites else ()
    if args.unlabelled_sites >= args.sites:
        raise DataError("--unlabelled-sites must leave at least one site with labels")
    return simulate_sites(X, y, args.sites, args.split, args.labeled_fraction, args.seed, unl,
                          n_classes=int(y.max()) + 1), name


def _peak_memory() -> int:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cmd_simulate_predict(args) -> int:
    from xclp.baselines import centralized_lp, per_site_lp
    from xclp.job_params import JobParams
    from xclp.privacy import label_dp
    from xclp.privacy.ledger import PrivacyLedger, no_privacy
    from xclp.simulation import run_xclp, unlabelled_accuracy

    ds, source = load_dataset(args)
    params = JobParams(job_id=f"sim-{args.seed}", n_classes=ds.n_classes, bits=args.bits, k=args.k,
                       alpha=args.alpha, power=args.power, similarity=args.similarity, crypto=args.crypto,
                       solver=args.solver, key_bits=args.key_bits, standardize=args.standardize,
                       **_graph_params(args), **label_dp_params(args, ds.n_classes)).validate()
    privacy = no_privacy()
    if params.label_flip > 0 or params.dp_noise > 0:
        ledger = PrivacyLedger(args.dp_delta, args.dp_epsilon, neighbouring=label_dp.LABEL_LEVEL)
        label_dp.spend(ledger, params)  # before the run: a job past the budget never starts
        privacy = ledger.to_json()
    say = (lambda m: None) if args.quiet else (lambda m: print(f"  · {m}", file=sys.stderr, flush=True))
    say(f"{source}: {ds.n} points, {len(ds.sites)} sites, {ds.n_classes} classes, "
        f"{int((ds.y >= 0).sum())} labelled")
    res = run_xclp(ds, params, seed=args.seed, progress=say, keep_graph=False)  # (only the labels are read)
    acc = {"xclp": unlabelled_accuracy(ds, res.labels)}
    base = {}
    t0 = time.perf_counter()
    if not args.no_baselines and ds.y_true is not None:
        say("baselines: per-site LP and centralized LP")
        # scaled as XCLP was: a site by its own moments, the pooled reference by all points'
        kw = dict(k=args.k, alpha=args.alpha, power=args.power, standardize=params.standardize)
        base["per_site"] = per_site_lp(ds, **kw)
        base["centralized"] = centralized_lp(ds, **kw)
        for name, lab in base.items():
            acc[name] = unlabelled_accuracy(ds, lab)
    baseline_seconds = time.perf_counter() - t0
    per_site = {}
    for s in ds.sites:
        m = ds.site == s
        row = {"xclp": unlabelled_accuracy(ds, res.labels, m)}
        for name, lab in base.items():
            row[name] = unlabelled_accuracy(ds, lab, m)
        per_site[s] = row
    out = {
        "n": ds.n, "sites": len(ds.sites), "classes": ds.n_classes, "bits": args.bits, "crypto": args.crypto,
        "k": args.k, "alpha": args.alpha, "power": args.power, "similarity": args.similarity, "seed": args.seed,
        "standardize": params.standardize, "graph": params.graph_mode(ds.n),
        "dataset": source, "labelled": int((ds.y >= 0).sum()),
        "accuracy": {k: _num(v) for k, v in acc.items()},
        "per_site_accuracy": {s: {k: _num(v) for k, v in r.items()} for s, r in per_site.items()},
        "site_sizes": {s: {"n": int((ds.site == s).sum()), "labelled": int(((ds.y >= 0) & (ds.site == s)).sum())}
                       for s in ds.sites},
        "timings": {k: round(v, 4) for k, v in res.timings.items()},
        "baseline_seconds": round(baseline_seconds, 4),
        "bytes": res.bytes,
        "solver": res.solver,
        "peak_memory_bytes": _peak_memory(),
        "privacy": privacy,
        "label_dp": {"label_flip": params.label_flip, "dp_noise": params.dp_noise, "dp_clip": params.dp_clip},
    }
    _print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if args.predictions:
        np.savez(args.predictions, labels=res.labels, confidence=res.confidence)
    return 0


def _num(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else round(float(v), 6)


def _pct(v) -> str:
    return "   n/a" if v is None else f"{100 * v:6.2f}"


def _print_table(out: dict) -> None:
    cols = [c for c in ("xclp", "per_site", "centralized") if c in out["accuracy"]]
    print(f"\nXCLP on {out['dataset']}: n={out['n']}, {out['sites']} sites, {out['classes']} classes, "
          f"L={out['bits']}, k={out['k']}, crypto={out['crypto']}")
    print("accuracy on unlabelled points (%)")
    head = f"{'site':<12}{'points':>8}{'labels':>8}" + "".join(f"{c:>13}" for c in cols)
    print(head)
    print("-" * len(head))
    for s, r in out["per_site_accuracy"].items():
        z = out["site_sizes"][s]
        print(f"{s:<12}{z['n']:>8}{z['labelled']:>8}" + "".join(f"{_pct(r.get(c)):>13}" for c in cols))
    print("-" * len(head))
    print(f"{'all':<12}{out['n']:>8}{out['labelled']:>8}" + "".join(f"{_pct(out['accuracy'][c]):>13}" for c in cols))
    t = out["timings"]
    print("seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()) + f"  (solver: {out['solver']})")
    print(f"bytes sent: {out['bytes']['total']:,}")
    if out["privacy"]["epsilon"] is not None:
        pr = out["privacy"]
        print(f"label-DP: ε = {pr['epsilon']:.4g} at δ = {pr['delta']:g} ({pr['neighbouring']})")


def cmd_plot(args) -> int:
    from cli.train import cmd_plot as run  # matplotlib and torch only when plotting

    return run(args)


def cmd_audit(args) -> int:
    from cli.audit import cmd_audit as run

    return run(args)


def cmd_simulate_train(args) -> int:
    from cli.train import cmd_simulate_train as run

    return run(args)


def cmd_bench_hamming(args) -> int:
    from xclp.bench_hamming import bench_hamming

    out = bench_hamming(args.protocol, args.sizes[0], args.sizes[1], args.bits, seed=args.seed,
                        key_bits=args.key_bits)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0 if out["exact"] else 1


def _deadlines(items: list[str] | None) -> dict:
    out = {}
    for item in items or []:
        phase, _, secs = item.partition("=")
        try:
            out[phase] = float(secs)
        except ValueError:
            raise DataError(f"--deadline {item!r}: expected PHASE=SECONDS") from None
    return out


def _secret(args, name: str, env: str, required: bool = True) -> str | None:
    """A token from --NAME=VALUE, else --NAME-file FILE (first line), else $ENV. A value on the command
    line is visible to every user of the machine (ps, /proc): prefer the file or the environment."""
    value = getattr(args, name)
    path = getattr(args, f"{name}_file", None)
    if value is None and path is not None:
        try:
            value = Path(path).read_text().strip().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise DataError(f"--{name.replace('_', '-')}-file {path}: cannot read a token from it ({exc})") from None
    if value is None:
        value = os.environ.get(env)
    if required and not value:
        raise DataError(f"no {name.replace('_', ' ')}: give --{name.replace('_', '-')}-file FILE or set ${env} "
                        f"(or --{name.replace('_', '-')}=VALUE, which other users can see in the process list)")
    return value


def _database_password_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-password-file", default=None, metavar="FILE",
                   help="file whose first line is the database's password, put into --database's URL (default: none; "
                        "PostgreSQL's own $PGPASSWORD and ~/.pgpass work too). A Docker secret: /run/secrets/NAME")


def _database(args) -> str:
    """The coordinator's database URL: --database, else $XCLP_DATABASE_URL (secrets in the environment, not in
    ps), else the SQLite default; with --database-password-file, the password read from that file."""
    url = args.database or os.environ.get("XCLP_DATABASE_URL") or "sqlite:///xclp-coordinator.db"
    if args.database_password_file is None:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from service.db import database_url

    try:
        parsed = make_url(database_url(url))
    except ArgumentError:
        raise DataError(f"--database {url!r}: not a database URL (postgresql+psycopg2://USER@HOST/DB)") from None
    if parsed.drivername.startswith("sqlite"):
        raise DataError("--database-password-file: a SQLite database has no password (give a postgresql URL)")
    if parsed.password:
        raise DataError("--database-password-file: the --database URL holds a password already: give it once, "
                        "in the file (postgresql+psycopg2://USER@HOST/DB)")
    try:
        password = Path(args.database_password_file).read_text().splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise DataError(f"--database-password-file {args.database_password_file}: cannot read a password from it "
                        f"({exc})") from None
    return parsed.set(password=password).render_as_string(hide_password=False)


def tcp_port(text: str) -> int:
    """A TCP port (argparse type): 1..65535; uvicorn given another waits forever instead of failing."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is a number from 1 to 65535, got {text!r}")
    return port


def cmd_coordinator_serve(args) -> int:
    from cli.serve import serve
    from cli.tls import serve_tls

    serve(args.host, args.port, _database(args), _secret(args, "admin_token", "XCLP_ADMIN_TOKEN", required=False),
          args.max_body_mb, _deadlines(args.deadline), blob_dir=args.blob_dir, public_url=args.public_url,
          allowed_hosts=args.allowed_host, public_metrics=args.public_metrics, executor=args.executor, workers=args.workers,
          dask_address=args.dask_address, threads=args.threads, poll_lane=args.poll_lane, **serve_tls(args))
    return 0


def cmd_coordinator_migrate(args) -> int:
    from cli.serve import migrate

    return migrate(_database(args), args.dry_run)


def cmd_coordinator_db_version(args) -> int:
    from cli.serve import db_version

    return db_version(_database(args))


def _admin(args):
    from cli.tls import client_tls
    from clients.api import CoordinatorClient

    return CoordinatorClient(args.coordinator, _secret(args, "admin_token", "XCLP_ADMIN_TOKEN"), **client_tls(args))


def cmd_site_add(args) -> int:
    from cli.tables import add_site_with_token_file

    return add_site_with_token_file(_admin(args), args)


def cmd_site_revoke(args) -> int:
    from cli.tables import revoke_site

    return revoke_site(_admin(args), args)


def cmd_site_rotate_token(args) -> int:
    from cli.tables import rotate_token

    return rotate_token(_admin(args), args)


def cmd_site_list(args) -> int:
    from cli.tables import print_sites

    return print_sites(_admin(args).sites(stale_after=args.stale_after * 60), args.json)


def _ops(name: str):
    """A command of cli.operations, with the operator's client."""

    def run(args) -> int:
        import cli.operations

        return getattr(cli.operations, name)(_admin(args), args)

    return run


def cmd_job_list(args) -> int:
    from cli.tables import print_jobs

    return print_jobs(_admin(args).jobs(kind=args.kind, status=args.status, fold=not args.unfold), args.json,
                      filtered=bool(args.kind or args.status))


def _site_names(text: str) -> list[str]:
    """--sites "a, b" or "a,b": the names, without the spaces around them."""
    return [s.strip() for s in text.split(",") if s.strip()]


def cmd_agent_run(args) -> int:
    import logging

    from cli.logs import setup_logging
    from cli.tls import client_tls
    from clients.agent import Agent
    from clients.api import CoordinatorClient

    setup_logging("INFO")
    logging.getLogger("xclp.agent").info("agent %s starting on %s", args.site, args.coordinator)
    from xclp.site_policy import SitePolicy

    policy = SitePolicy(allow_plaintext=args.allow_plaintext, allow_unmasked=args.allow_unmasked_training,
                        allow_trusted_coordinator=args.allow_trusted_coordinator,
                        min_key_bits=args.min_key_bits, min_bits=args.min_bits, min_sites=args.min_sites,
                        max_epsilon=args.max_epsilon, max_delta=args.max_delta, min_colluders=args.min_colluders)
    membership = _membership(args)
    columns = _columns(args)
    if columns.schema is not None:  # the operators compare this digest: the same schema, the same columns
        logging.getLogger("xclp.agent").info("site %s reads %s through the schema %s (%s)", args.site, args.data,
                                             args.schema, columns.schema.digest())
    api = CoordinatorClient(args.coordinator, _secret(args, "token", "XCLP_TOKEN"), **client_tls(args))
    agent = Agent(api, args.site, args.data, args.out, args.poll, public=args.public, policy=policy,
                  columns=columns, max_poll=args.max_poll, membership=membership,
                  identity_key=args.identity_key, trust_on_first_use=args.trust_on_first_use,
                  keep_rounds=args.keep_rounds)
    if membership:
        logging.getLogger("xclp.agent").info("site %s takes part only with the %d site(s) of %s", args.site,
                                             len(membership.members), membership.source)
    else:
        logging.getLogger("xclp.agent").warning("site %s has no membership: it trusts any site the coordinator names "
                                                "on first use (--trust-on-first-use)", args.site)
    logging.getLogger("xclp.agent").info("site %s identity %s (give it to the other sites' operators: --pin %s=%s)",
                                         args.site, agent.identity.fingerprint, args.site, agent.identity.fingerprint)
    import signal

    def _stop(signum, frame):  # SIGTERM as Ctrl-C: the agent says "leaving" where a restart cannot resume
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    agent.run(once=args.once)
    return 0


def _membership(args):
    """The peers this site's operator admitted: --membership FILE and the --pins (crypto.identity.Membership);
    with neither, --trust-on-first-use must say that the site trusts whatever sites the coordinator names."""
    from crypto.identity import Membership

    pins = _pins(args.pin)
    membership = Membership.load(args.membership, pins) if args.membership else Membership(pins)
    if not membership and not args.trust_on_first_use:
        raise ValueError("this site has no membership: give --membership FILE (the consortium's sites and their "
                         "identity fingerprints, as `xclp agent identity` prints them) or --pin SITE=SHA256:… for "
                         "each peer; --trust-on-first-use takes any site the coordinator names instead")
    return membership


def cmd_agent_identity(args) -> int:
    """This site's identity fingerprint (the key made now if there is none), for the consortium's membership."""
    from crypto.identity import Identity
    from xclp.job_files import make_folder

    key = args.identity_key or make_folder(make_folder(args.out, "--out") / ".agent-state", "--out", mode=0o700) \
        / "identity.key"
    me = Identity.load_or_create(key)
    print(json.dumps({"sites": {args.site: me.fingerprint}}) if args.json else f"{args.site} {me.fingerprint}")
    return 0


def _pins(given: list[str] | None) -> dict[str, str]:
    out = {}
    for item in given or []:
        site, sep, fp = item.partition("=")
        if not sep or not site or not fp.startswith("SHA256:"):
            raise ValueError(f"--pin {item!r}: give SITE=SHA256:… (the fingerprint the site's agent logs at start)")
        out[site.strip()] = fp.strip()
    return out


def _scored(row: dict) -> str:
    """What a training job's `local_accuracy` measures (xclp.training.strategy.SCORED_ON)."""
    from xclp.training.strategy import SCORED_ON

    return row.get("local_accuracy_of") or SCORED_ON[None]


def cmd_job_submit(args) -> int:
    sites = _site_names(args.sites)
    dp = {} if args.dp_epsilon is None else {"dp_epsilon": args.dp_epsilon, "dp_delta": args.dp_delta,
                                             "label_dp": args.label_dp, "dp_clip": args.dp_clip}
    options = {o.name: getattr(args, o.name) for o in JOB_OPTIONS}  # every one is a flag of `job submit predict`
    job = _admin(args).submit_job(kind="predict", sites=sites, classes=args.classes, deadlines=_deadlines(args.deadline),
                                  **options, **dp)
    print(json.dumps({"job": job}) if args.json else job)
    return 0


def cmd_job_submit_train(args) -> int:
    sites = _site_names(args.sites)
    from xclp.training.options import TRAINING_OPTIONS

    body = {k: getattr(args, k) for k in ("algorithm", "classes", "max_missed_rounds", "secure_aggregation",
                                           *TRAIN_JOB_OPTIONS)}
    body.update({o.name: getattr(args, o.name) for o in TRAINING_OPTIONS})  # the request's fields, by the flags' names
    body["sites_per_round"] = args.sites_per_round or min(5, len(sites))
    if args.model:
        names = [m for m in args.model.split(",") if m]
        body["model"] = names[0] if len(names) == 1 else [names[i % len(names)] for i in range(len(sites))]
    if args.public:
        from xclp.training.fedct import PublicSet

        pub = PublicSet.load(args.public)
        body.update(public_sha256=pub.digest, public_size=len(pub.X))
    elif args.public_sha256:
        body.update(public_sha256=args.public_sha256, public_size=args.public_size)
    job = _admin(args).submit_train(sites=sites, deadlines=_deadlines(args.deadline), **body)
    print(json.dumps({"job": job}) if args.json else job)
    return 0


def cmd_job_status(args) -> int:
    st = _admin(args).job(args.job)
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        p = st["progress"]
        from xclp.job_kinds import job_kind

        if job_kind(st["kind"]).rounds:
            hist = st["training"].get("history") or []
            last = hist[-1] if hist else {}
            final = st["training"].get("final") or {}
            print(f"job {st['job']} ({st['params']['algorithm']}): {_shown(st)}, phase {st['phase']}, "
                  f"round {p.get('rounds_done', 0)}/{p.get('rounds')} done"
                  + (f"; last round: {_scored(last)} {last.get('local_accuracy')}, left out "
                     f"{last.get('left_out')}" if last else "")
                  + (f"; final: {_scored(final)} {final.get('local_accuracy')}" if final else "")
                  + (f"; COLLAPSED at {','.join(final['collapsed'])}: the final model is no better than the "
                     "majority class there" if final.get("collapsed") else "")
                  + (f"; privacy spent: ε = {priv['epsilon']:.3g} at δ = {priv['delta']:g} of a budget of "
                     f"{priv['budget']:g}" if (priv := st["training"].get("privacy")) else "")
                  + (f"; dropped {st['dropped']}" if st["dropped"] else "")
                  + (f"; failure: {st['failure']}" if st["failure"] else ""))
        else:
            print(f"job {st['job']}: {_shown(st)}, phase {st['phase']} (attempt {st['attempt']}), "
                  f"{p['received']}/{p['expected']} parts; live {','.join(st['live'])}"
                  + (f"; dropped {st['dropped']}" if st["dropped"] else "")
                  + (f"; failure: {st['failure']}" if st["failure"] else ""))
        from cli.progress import waiting_lines

        for line in waiting_lines(st):
            print("  " + line)
        for site, why in (st.get("refused") or {}).items():
            print(f"  {site} refused: {why}")
    return 0


def _shown(st: dict) -> str:
    """A job's status as the lists show it: `cancelled` for one the operator ended (service.job_list)."""
    return "cancelled" if st.get("cancelled") else st["status"]


def cmd_job_cancel(args) -> int:
    st = _admin(args).cancel(args.job)
    print(f"job {st['job']}: {_shown(st)} ({st['failure']}); the sites wipe its keys at their next sweep")
    return 0


def cmd_job_wait(args) -> int:
    from cli.progress import wait_for_job

    st = wait_for_job(_admin(args), args.job, args.timeout, quiet=args.quiet)
    if st is None:
        print(f"job {args.job}: still running after {args.timeout} s", file=sys.stderr)
        return WAIT_TIMEOUT
    if st["status"] == "failed":
        print(f"job {args.job} {'was cancelled' if st.get('cancelled') else 'failed'}: {st['failure']}", file=sys.stderr)
        for site, why in (st.get("refused") or {}).items():
            print(f"  {site} refused: {why}", file=sys.stderr)
        return WAIT_FAILED
    print(f"job {args.job} done" + (f" (dropped: {st['dropped']})" if st["dropped"] else ""))
    if st["dropped"]:  # done, but not for every site: an unattended run must not read this as success
        for site, phase in st["dropped"].items():
            why = (st.get("refused") or {}).get(site) or "did not do its part before the phase's deadline"
            print(f"  {site} dropped in {phase}, got no results: {why}", file=sys.stderr)
        return WAIT_DROPPED
    collapsed = ((st.get("training") or {}).get("final") or {}).get("collapsed")
    if collapsed:  # done, but the model is a constant where it counts: not a success to read unattended
        print(f"  the final model is no better than the majority class at {', '.join(collapsed)} (it predicts "
              "too few classes): check the data's schema, --standardize, --lr and --rounds", file=sys.stderr)
        return WAIT_COLLAPSED
    return 0


# `xclp job wait`'s exit codes (its --help and docs/operating.md list them)
WAIT_FAILED, WAIT_TIMEOUT, WAIT_DROPPED, WAIT_COLLAPSED = 1, 3, 4, 5
WAIT_CODES = ("exit codes: 0 done, every site got its results; 1 failed; 2 an error (unreachable coordinator, "
              "unknown job); 3 still running after --timeout; 4 done, but a site was dropped (it got no results: "
              "the lines on stderr say which and why); 5 a training job done, but its final model is no better "
              "than the majority class at some site (collapsed; stderr names them; 4 wins where both hold); "
              "130 interrupted")


def cmd_demo(args) -> int:
    from cli.demo import run_demo

    if args.train:
        from cli.demo import run_train_demo

        return run_train_demo(args.train, crypto=args.crypto, json_out=args.json, bits=args.bits or 256,
                              sites=args.sites, rounds=args.rounds, seed=args.seed)
    return run_demo(crypto=args.crypto, json_out=args.json, bits=args.bits or 1024, sites=args.sites, seed=args.seed)


def _label_dp_args(group) -> None:
    """A prediction job's label-DP flags, in process (`simulate predict`) and through the coordinator
    (`job submit predict`) alike."""
    group.add_argument("--dp-epsilon", type=_positive_float, default=None,
                       help="a label-DP budget ε for the job's releases about the labels, which calibrates the "
                            "mechanism below (agents started with --max-epsilon take part only in jobs that state "
                            "one; default: none, exact sums)")
    group.add_argument("--dp-delta", type=_positive_float, default=1e-5, help="δ of the budget")
    group.add_argument("--label-dp", choices=("rr", "gaussian"), default="rr",
                       help="rr: randomized response on each site's labels (far more accurate at equal ε); "
                            "gaussian: noise shares inside the secure sums")


def build_parser() -> argparse.ArgumentParser:
    from cli.helpfmt import Parser

    parser = Parser(prog="xclp", description="Privacy-preserving cross-client label propagation")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="in-process simulations of XCLP jobs").add_subparsers(dest="what", required=True)
    pred = sim.add_parser("predict", help="one-shot transductive prediction over simulated sites")
    _add_predict_args(pred)
    pred.set_defaults(func=cmd_simulate_predict)

    tr = sim.add_parser("train", help="federated training (FedAvg/FedCT ± XCLP pseudo-labels, FedKT, FREDY)")
    from cli.train_args import add_train_args

    add_train_args(tr)
    tr.set_defaults(func=cmd_simulate_train)

    au = sub.add_parser("audit", help="membership-inference audit of what a simulated training run releases")
    add_train_args(au)
    au.add_argument("--attack", choices=("loss", "lira"), default="lira",
                    help="lira (shadow runs, Carlini et al. 2022; default) or loss (the loss threshold, Yeom et al. 2018)")
    au.add_argument("--shadows", type=int, default=4, help="LiRA: shadow runs on points the target never saw (default 4)")
    au.add_argument("--target", choices=("model", "labels"), default="model",
                    help="model: the released model(s) (default); labels: the labels the run shares on public points "
                         "(FedCT's consensus, FedKT's and FREDY's vote labels), through a k-NN proxy")
    au.set_defaults(func=cmd_audit)

    pl = sub.add_parser("plot", help="accuracy curves of training runs (simulation or job status JSON files)")
    pl.add_argument("runs", nargs="+", help="JSON of `xclp simulate train --json` or `xclp job status ID --json`")
    pl.add_argument("--out", required=True, help="PNG to write")
    pl.add_argument("--title", default=None, help="the plot's title (default: none)")
    pl.set_defaults(func=cmd_plot)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    bh = bench.add_parser("hamming", help="secure Hamming distance between two sites")
    bh.add_argument("--protocol", choices=CRYPTO_CHOICES, required=True, help="the protocol to measure")
    bh.add_argument("--sizes", type=int, nargs=2, metavar=("NA", "NB"), default=[100, 100],
                    help="points at each of the two sites")
    add_job_options(bh, ("bits", "key_bits"))
    bh.add_argument("--seed", type=int, default=0, help="random seed of the points and keys")
    bh.add_argument("--json", type=Path, help="write the measurements as JSON to this file (default: none)")
    bh.set_defaults(func=cmd_bench_hamming)

    from cli.plan import add_plan_parser
    from cli.tls import add_client_tls_args, add_serve_tls_args, add_tls_parser

    def coord_args(p, admin=True):
        p.add_argument("--coordinator", required=True, help="coordinator URL, e.g. https://coord.example:8000")
        add_client_tls_args(p)
        if admin:
            p.add_argument("--admin-token", default=None, help="operator token (visible in ps: prefer the next two; "
                           "default: --admin-token-file, else $XCLP_ADMIN_TOKEN)")
            p.add_argument("--admin-token-file", default=None, help="file whose first line is the operator token "
                           "(default: $XCLP_ADMIN_TOKEN)")

    co = sub.add_parser("coordinator", help="the coordinator service").add_subparsers(dest="what", required=True)
    cs = co.add_parser("serve", help="run the coordinator (FastAPI + uvicorn)")
    cs.add_argument("--host", default="127.0.0.1",
                    help="address to listen on: 0.0.0.0 (or this machine's address) to reach the sites, which needs "
                         "--tls-cert/--tls-key or --insecure-http behind a TLS proxy; 127.0.0.1 for this machine only")
    cs.add_argument("--port", type=tcp_port, default=8000, help="TCP port to listen on, 1–65535 (e.g. 8443 for "
                    "HTTPS)")
    cs.add_argument("--database", default=None,
                    help="SQLAlchemy URL: sqlite:///FILE (default: $XCLP_DATABASE_URL, else "
                         "sqlite:///xclp-coordinator.db) or postgresql+psycopg2://USER@HOST/DB with the password from "
                         "--database-password-file (a password in the URL shows in ps); its schema is migrated to "
                         "this release's at start (back it up before an upgrade: docs/operating.md)")
    _database_password_arg(cs)
    cs.add_argument("--admin-token", default=None, help="operator token, at least 32 characters (or "
                    "--admin-token-file, or $XCLP_ADMIN_TOKEN; e.g. `openssl rand -hex 24`; default: none, the operator's "
                    "calls are refused)")
    cs.add_argument("--admin-token-file", default=None, help="file whose first line is the operator token "
                    "(default: $XCLP_ADMIN_TOKEN)")
    cs.add_argument("--max-body-mb", type=int, default=1024,
                    help="largest message upload a site may make (MiB; default 1024); the operator's JSON calls "
                         "take at most 1 MiB and the dashboard's forms 4 KiB")
    cs.add_argument("--public-url", default=None,
                    help="the address browsers reach the coordinator at, e.g. https://coord.example.org (default: "
                         "none). Dashboard POSTs from this origin pass the cross-site check besides the request's "
                         "own scheme and Host; an https address makes the session cookie Secure")
    cs.add_argument("--allowed-host", action="append", metavar="NAME", default=None,
                    help="a host name (or address) clients reach the coordinator by, besides those it answers to "
                         "anyway: the --host it listens on (with localhost and 127.0.0.1 when that is loopback; this "
                         "machine's names when it is 0.0.0.0), --public-url's host and the names of --tls-cert. A "
                         "request whose Host header names none of them is refused (421): a DNS-rebinding page. "
                         "Repeatable (default: none beyond those); *.example.org matches one label; * turns the "
                         "check off")
    cs.add_argument("--public-metrics", action="store_true",
                    help="serve GET /metrics without the admin token (default: off, the admin token is needed)")
    cs.add_argument("--blob-dir", default=None,
                    help="folder for message bodies of 1 MiB or more (default: <database file>.blobs for SQLite; "
                         "none for PostgreSQL, where they stay in the database)")
    cs.add_argument("--deadline", action="append", metavar="PHASE=SECONDS",
                    help="default per-phase deadline of new jobs (setup, seed, counts, hamming, row_sums; repeatable; default: "
                         "setup 10 min, hamming 1 h, the others 2–10 min), and idle=SECONDS: how long a site the "
                         "phase awaits may go without contact before it is dropped (default 300)")
    cs.add_argument("--executor", choices=("process", "serial", "dask"), default="process",
                    help="where a blocked graph's heavy steps (candidate tables, influence columns) run: a process "
                         "pool on this machine (default; started only by a step with several tasks), in the "
                         "coordinator's process (serial), or a Dask cluster (dask, with --dask-address)")
    cs.add_argument("--workers", type=int, default=None,
                    help="processes of the pool (default: min(4, this machine's cores))")
    cs.add_argument("--dask-address", default=None,
                    help="the Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: none; with --executor dask; needs the scale "
                         "extra: pip install \"xclp[scale]\")")
    cs.add_argument("--threads", type=int, default=40,
                    help="worker threads answering requests (default 40); the database pool keeps this many "
                         "connections and 5 more (PostgreSQL's max_connections must allow them, and 10 more)")
    cs.add_argument("--poll-lane", type=int, default=4,
                    help="the sites' status polls (GET /work, GET /jobs/ID) answered at once (default 4); the others "
                         "wait their turn, and the operator's looks pass them: 0 answers every poll at once")
    add_serve_tls_args(cs)
    cs.set_defaults(func=cmd_coordinator_serve)
    database_help = ("SQLAlchemy URL of the coordinator's database: sqlite:///FILE or postgresql+psycopg2://USER@HOST/DB "
                     "(default: $XCLP_DATABASE_URL, else sqlite:///xclp-coordinator.db, serve's)")
    cm = co.add_parser("migrate", help="bring the database's schema to this release's (serve does it at start too); "
                       "back the database up first (docs/operating.md)")
    cm.add_argument("--database", default=None, help=database_help)
    _database_password_arg(cm)
    cm.add_argument("--dry-run", action="store_true",
                    help="print the current and target revisions and the SQL, change nothing (default: migrate)")
    cm.set_defaults(func=cmd_coordinator_migrate)
    cv = co.add_parser("db-version", help="the database's schema revision, and this release's newest")
    cv.add_argument("--database", default=None, help=database_help)
    _database_password_arg(cv)
    cv.set_defaults(func=cmd_coordinator_db_version)

    site = sub.add_parser("site", help="sites (operator)").add_subparsers(dest="what", required=True)
    sa = site.add_parser("add", help="register a site and print its token")
    sa.add_argument("name", help="the site's name (letters, digits, . _ -), as its agent's --site")
    coord_args(sa)
    sa.add_argument("--json", action="store_true", help="print {\"site\": …, \"token\": …} as JSON")
    sa.add_argument("--fingerprint", default=None, metavar="SHA256:…",
                    help="the site's identity fingerprint, as its agent logs it at start (default: none); its "
                         "announces must then be signed by that identity, and `site list` shows it")
    sa.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                    help="write the site's token to PATH (a new file, mode 0600) instead of printing it: the file "
                         "the site's `xclp agent run --token-file PATH` reads; default: printed)")
    sa.set_defaults(func=cmd_site_add)
    sr = site.add_parser("revoke", help="take a site out of service: its token stops working, its running jobs "
                                       "drop it, and no new job may name it")
    sr.add_argument("name", help="the site's name")
    coord_args(sr)
    sr.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    sr.set_defaults(func=cmd_site_revoke)
    st = site.add_parser("rotate-token", help="give a site a new token (the old one stops working; the site keeps "
                                              "its identity and its jobs)")
    st.add_argument("name", help="the site's name")
    coord_args(st)
    st.add_argument("--json", action="store_true", help="print {\"site\": …, \"token\": …} as JSON")
    st.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                    help="write the new token to PATH (a new file, mode 0600) instead of printing it (default: printed)")
    st.set_defaults(func=cmd_site_rotate_token)
    sl = site.add_parser("list", help="the registered sites, and when each last contacted the coordinator")
    coord_args(sl)
    sl.add_argument("--json", action="store_true", help="print the sites as JSON instead of a table")
    sl.add_argument("--stale-after", type=_positive_float, default=10.0, metavar="MINUTES",
                    help="mark a site in service 'stale' when its last contact is older than this (default: 10 minutes)")
    sl.set_defaults(func=cmd_site_list)
    srd = site.add_parser("readmit", help="admit a revoked site again under its name and registered identity, with "
                                          "a new token (the revoked one stays refused)")
    srd.add_argument("name", help="the revoked site's name")
    coord_args(srd)
    srd.add_argument("--json", action="store_true", help="print {\"site\": …, \"token\": …} as JSON")
    srd.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                     help="write the new token to PATH (a new file, mode 0600) instead of printing it (default: printed)")
    srd.set_defaults(func=_ops("site_readmit"))
    sp = site.add_parser("purge", help="delete a revoked site's data: every message it sent or was sent (its "
                                       "uploads, its results); its name and identity stay")
    sp.add_argument("name", help="the revoked site's name")
    coord_args(sp)
    sp.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    sp.set_defaults(func=_ops("site_purge"))

    op = sub.add_parser("operator", help="operators, each with a token of their own (the audit log names them)") \
        .add_subparsers(dest="what", required=True)
    oa = op.add_parser("add", help="add an operator and print its token once (the coordinator keeps its SHA-256)")
    oa.add_argument("name", help="the operator's name (letters, digits, . _ -), as the audit log will show it")
    coord_args(oa)
    oa.add_argument("--json", action="store_true", help="print {\"operator\": …, \"token\": …} as JSON")
    oa.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                    help="write the token to PATH (a new file, mode 0600) instead of printing it (default: printed)")
    oa.set_defaults(func=_ops("operator_add"))
    ol = op.add_parser("list", help="the operators: the bootstrap 'admin', and each added one (active or revoked)")
    coord_args(ol)
    ol.add_argument("--json", action="store_true", help="print the operators as JSON instead of a table")
    ol.set_defaults(func=_ops("operator_list"))
    orv = op.add_parser("revoke", help="revoke an operator: its token stops working at once")
    orv.add_argument("name", help="the operator's name")
    coord_args(orv)
    orv.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    orv.set_defaults(func=_ops("operator_revoke"))

    lg = sub.add_parser("log", help="the audit log: who did what, when, from where (operators' and sites' actions, "
                                    "refused tokens)")
    coord_args(lg)
    lg.add_argument("--since", default=None, metavar="WHEN",
                    help="only records since WHEN: an ISO time in UTC (2026-11-27T09:00) or an age (30m, 2h, 7d; "
                         "default: all)")
    lg.add_argument("--action", default=None, help="only this action (job.submit, site.revoke, auth.failed, …) or "
                                                   "a prefix ending in '.' (site.; default: all)")
    lg.add_argument("--who", default=None, help="only this operator's or site's records (default: everyone's)")
    lg.add_argument("--target", default=None, help="only records about this job or site (default: all)")
    lg.add_argument("--limit", type=int, default=1000, help="at most this many records, the newest (default 1000)")
    lg.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")
    lg.set_defaults(func=_ops("audit_log"))

    agent = sub.add_parser("agent", help="the site agent").add_subparsers(dest="what", required=True)
    ar = agent.add_parser("run", help="run this site's agent until stopped")
    coord_args(ar, admin=False)
    ar.add_argument("--site", required=True, help="this site's name, as registered with `xclp site add`")
    ar.add_argument("--token", default=None, help="the site's token (visible in ps: prefer --token-file or $XCLP_TOKEN; "
                    "default: --token-file, else $XCLP_TOKEN)")
    ar.add_argument("--token-file", default=None, help="file whose first line is the site's token (default: $XCLP_TOKEN)")
    ar.add_argument("--allow-plaintext", action="store_true",
                    help="take part in predict jobs with crypto=plaintext (LSH bits and sums in the clear)")
    ar.add_argument("--allow-trusted-coordinator", action="store_true",
                    help="take part in predict jobs whose crypto trusts the coordinator not to collude with a site "
                         "(crypto=masked: fast at scale; a coordinator with one site would learn this site's codes)")
    ar.add_argument("--allow-unmasked-training", action="store_true",
                    help="take part in FedAvg jobs without secure aggregation (weights in the clear)")
    ar.add_argument("--min-key-bits", type=int, default=2048, help="refuse Paillier keys below this size")
    ar.add_argument("--min-bits", type=int, default=1, help="refuse jobs with an LSH length L below this")
    ar.add_argument("--min-sites", type=int, default=2, help="refuse jobs with fewer participants")
    ar.add_argument("--min-colluders", type=int, default=0,
                    help="refuse a masked training round in which the coordinator with fewer than N colluding sites "
                         "could open this site's update (its Shamir threshold τ, as this site computes it, below N; "
                         "docs/security.md; default: none)")
    ar.add_argument("--max-epsilon", type=_positive_float, default=None,
                    help="require differential privacy: refuse jobs that state no DP budget, one above ε = E, or "
                         "one that would take this site's total about its data past E (its ledger in "
                         "OUT/.agent-state/privacy-ledger.json, across jobs and runs; default: none, no DP required)")
    ar.add_argument("--max-delta", type=_positive_float, default=1e-5, help="... or a δ above this (default 1e-5)")
    ar.add_argument("--data", required=True, help="the site's data: .npz with X (n×d) and y (−1 = unlabelled), "
                    ".csv or .parquet (a label column, empty or −1 = unlabelled; the other columns features; text "
                    "categories, class names, empty cells: --schema)")
    _add_column_args(ar)
    ar.add_argument("--out", required=True, help="folder for each job's results: <job>.npz (labels, confidence, "
                    "ids) and <job>.csv (id,label,confidence)")
    ar.add_argument("--keep-rounds", action="store_true",
                    help="also write each training round's XCLP labels (<child job>.npz and .csv) to --out (default: "
                         "only the training job's final <job>.npz, <job>.csv and model; the rounds' stay in "
                         "<out>/.agent-state)")
    ar.add_argument("--poll", type=float, default=0.1,
                    help="seconds between polls while a job of the site runs; with none, the wait doubles up to --max-poll")
    ar.add_argument("--max-poll", type=float, default=3.0, help="the longest wait between polls when idle (default 3 s)")
    ar.add_argument("--once", action="store_true", help="one pass over the pending work, then exit")
    ar.add_argument("--pin", action="append", default=None, metavar="SITE=SHA256:…",
                    help="a peer site's identity fingerprint, as its agent logs it at start (repeatable): a member "
                         "of this site's consortium, as in --membership (default: none)")
    ar.add_argument("--membership", default=None, metavar="FILE",
                    help='the consortium\'s sites this site takes part with, and their identity fingerprints: JSON '
                         '{"sites": {"NAME": "SHA256:…"}} (from each site\'s `xclp agent identity`); a job naming '
                         "any other site is refused before anything is sent (default: none; then --pin or "
                         "--trust-on-first-use)")
    ar.add_argument("--trust-on-first-use", action="store_true",
                    help="with no --membership and no --pin only: take part with any site the coordinator names, "
                         "pinning its identity on first use (a coordinator that lies could add sites of its own)")
    ar.add_argument("--identity-key", default=None,
                    help="this site's Ed25519 identity key file (default <out>/.agent-state/identity.key, made on "
                         "first start)")
    ar.add_argument("--public", default=None, help="FedCT: the public unlabelled set U (.npz with X), as pinned in the "
                    "job (default: none; FedCT jobs are refused)")
    ar.set_defaults(func=cmd_agent_run)
    ai = agent.add_parser("identity", help="print this site's identity fingerprint (made on first use), for "
                              "the consortium's membership file")
    ai.add_argument("--site", required=True, help="this site's name")
    ai.add_argument("--out", required=True, help="the agent's --out folder (its key: <out>/.agent-state/identity.key)")
    ai.add_argument("--identity-key", default=None, help="this site's key file, if not the default")
    ai.add_argument("--json", action="store_true", help='print {"sites": {NAME: FINGERPRINT}}')
    ai.set_defaults(func=cmd_agent_identity)

    data = sub.add_parser("data", help="a site's data file against the consortium's schema").add_subparsers(
        dest="what", required=True)
    dc = data.add_parser("check", help="every problem of a .csv/.parquet against the schema, one line each (file, "
                         "line, column); exit 0 when clean, 1 with problems, 2 when the schema or a flag is wrong")
    dc.add_argument("files", nargs="+", metavar="FILE", help="the site's data file(s)")
    _add_column_args(dc)
    dc.add_argument("--require-site", action="store_true",
                    help="the file is a simulation's (xclp simulate --data): it needs the site column (default: "
                         "a site's own file, no site column needed)")
    dc.add_argument("--max-per-column", type=int, default=20, metavar="N",
                    help="list at most N problems of one kind per column, then count the rest (default 20)")
    dc.add_argument("--all", action="store_true", help="list every problem")
    dc.set_defaults(func=cmd_data_check)
    ds = data.add_parser("schema", help="draft a schema from this site's own file(s) (JSON on stdout): every column "
                         "but the label, ID, site and ignored ones a feature; for the consortium to agree on — it lists "
                         "this site's categories and class names")
    ds.add_argument("files", nargs="+", metavar="FILE", help="the site's .csv/.parquet file(s)")
    ds.add_argument("--label-column", required=True, help="the label column")
    ds.add_argument("--id-column", default=None, help="a column of point IDs (not a feature; default: none)")
    ds.add_argument("--site-column", default=None, help="a simulation's site column, not a feature (default: none)")
    ds.add_argument("--truth-column", default=None, help="a truth column, not a feature (default: none)")
    ds.add_argument("--ignore-columns", default=None, metavar="A,B,…", help="columns to drop (default: none)")
    ds.add_argument("--out", default=None, help="write the draft to this file (default: stdout)")
    ds.set_defaults(func=cmd_data_schema)

    job = sub.add_parser("job", help="jobs (operator)").add_subparsers(dest="what", required=True)
    js = job.add_parser("submit", help="submit a job").add_subparsers(dest="kind", required=True)
    jp = js.add_parser("predict", help="one-shot transductive prediction")
    coord_args(jp)
    jp.add_argument("--sites", required=True, help="comma-separated site names, in roster order")
    add_job_options(jp, ("crypto", "bits", "k", "alpha", "power"), **SECURE_DEFAULTS)
    jp.add_argument("--classes", type=int, required=True, help=CLASSES_HELP)
    add_job_options(jp, ("standardize", "key_bits"))
    _add_graph_args(jp)
    jp.add_argument("--deadline", action="append", metavar="PHASE=SECONDS",
                    help="this job's deadline for a phase (setup, seed, counts, hamming, row_sums; repeatable; "
                         "default: the coordinator's --deadline); idle=SECONDS: a site the phase awaits that is "
                         "silent this long is dropped (default 300)")
    jdp = jp.add_argument_group("label-DP of what the job releases about the sites' labels (docs/privacy.md)")
    _label_dp_args(jdp)
    jdp.add_argument("--dp-clip", type=_positive_float, default=1.0,
                     help="gaussian: L2 bound C of each influence column over the other sites' rows")
    jp.add_argument("--json", action="store_true", help="print {\"job\": ID} as JSON")
    jp.set_defaults(func=cmd_job_submit)
    jt = js.add_parser("train", help="semi-supervised training rounds (FedAvg/FedCT, ± XCLP) with the sites training at home")
    coord_args(jt)
    jt.add_argument("--sites", required=True, help="comma-separated site names, in roster order")
    from cli.train_args import add_training_options
    from xclp.training.options import SERVICE_ALGORITHMS

    jt.add_argument("--algorithm", choices=SERVICE_ALGORITHMS, default="fedavg-xclp",
                    help="the training algorithm: FedAvg or FedCT, each with or without XCLP pseudo-labels, FedKT, FREDY")
    jt.add_argument("--model", default=None, help="FedAvg: mlp|cnn; FedCT: tree|forest|boosting|logreg|mlp|cnn "
                                                  "(a comma list is cycled over the sites; default: mlp for FedAvg, tree for FedCT)")
    jt.add_argument("--public", default=None, help="FedCT: the public set U (.npz with X or .npy); its SHA-256 is pinned (default: none)")
    jt.add_argument("--public-sha256", default=None, help="FedCT: pin U by digest instead of --public (default: none)")
    jt.add_argument("--public-size", type=int, default=None,
                    help="FedCT: the number of points of U pinned by --public-sha256 (default: none)")
    add_job_options(jt, TRAIN_JOB_OPTIONS, **SECURE_DEFAULTS)  # the XCLP child jobs'
    jt.add_argument("--classes", type=int, required=True, help=CLASSES_HELP)
    jt.add_argument("--max-missed-rounds", type=int, default=3, help="drop a site left out this many rounds in a row")
    jt.add_argument("--no-secure-aggregation", dest="secure_aggregation", action="store_false",
                    help="FedAvg: send the sites' updates to the coordinator in the clear (default: masked, "
                         "the coordinator sees only their sum)")
    add_training_options(jt)  # the options every driver shares, defined once (xclp.training.options)
    jt.add_argument("--deadline", action="append", metavar="PHASE=SECONDS",
                    help="this job's deadline for a phase: setup, round or evaluate (repeatable; default: the "
                         "coordinator's); idle=SECONDS: a site the current step (or its round's XCLP job) awaits "
                         "that is silent this long is dropped (default: the coordinator's, 300)")
    jt.add_argument("--json", action="store_true", help="print {\"job\": ID} as JSON")
    jt.set_defaults(func=cmd_job_submit_train)
    jl = job.add_parser("list", help="every job: kind, status, phase, sites, when submitted (a training job's "
                                     "rounds counted on its row)")
    coord_args(jl)
    jl.add_argument("--kind", choices=("predict", "train"), default=None, help="only jobs of this kind (default: all)")
    jl.add_argument("--status", choices=("running", "done", "failed", "cancelled"), default=None,
                    help="only jobs in this status (default: all)")
    jl.add_argument("--unfold", action="store_true",
                    help="list each training round's XCLP job on a row of its own (default: counted on its "
                         "training job's row)")
    jl.add_argument("--json", action="store_true", help="print the jobs as JSON instead of a table")
    jl.set_defaults(func=cmd_job_list)
    jst = job.add_parser("status", help="a job's phase, progress, dropouts")
    jst.add_argument("job", help="the job's id, as `job submit` printed it")
    coord_args(jst)
    jst.add_argument("--json", action="store_true", help="print the whole status as JSON")
    jst.set_defaults(func=cmd_job_status)
    jc = job.add_parser("cancel", help="end a running job; the sites wipe its keys")
    jc.add_argument("job", help="the job's id")
    coord_args(jc)
    jc.set_defaults(func=cmd_job_cancel)
    jpu = job.add_parser("purge", help="delete a finished job's messages, blob files and results (its row stays as a "
                                       "tombstone), or with --older-than every finished job older than that")
    jpu.add_argument("job", nargs="?", default=None, help="the job's id (or give --older-than)")
    coord_args(jpu)
    jpu.add_argument("--force", action="store_true",
                     help="a running job is cancelled first (default: a running job is refused)")
    jpu.add_argument("--older-than", type=_positive_float, default=None, metavar="DAYS",
                     help="purge every job that finished (done or failed) more than DAYS days ago: a retention "
                          "rule to run from cron (default: none, give a job's id)")
    jpu.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    jpu.set_defaults(func=_ops("job_purge"))
    jw = job.add_parser("wait", help="wait for a job; exit 0 when done, 1 if failed, 3 on timeout, 4 if done "
                                     "but a site was dropped, 5 if a training job's model collapsed", description="Wait for a job to finish, showing its "
                                     "progress and the sites it awaits on stderr. " + WAIT_CODES + ".")
    jw.add_argument("job", help="the job's id")
    coord_args(jw)
    jw.add_argument("--timeout", type=float, default=3600, help="seconds to wait before giving up with exit 3")
    jw.add_argument("--quiet", action="store_true", help="no progress on stderr")
    jw.set_defaults(func=cmd_job_wait)

    add_tls_parser(sub)
    add_plan_parser(sub)
    from cli.flower import add_flower_parser  # (imports no Flower: it runs Flower's own `flwr` CLI)

    add_flower_parser(sub)

    demo = sub.add_parser("demo", help="coordinator + 3 agents as processes on 127.0.0.1, one secure job")
    add_job_options(demo, ("crypto",), **SECURE_DEFAULTS)
    demo.add_argument("--bits", type=int, default=None, help="LSH bits (default 1024; 256 with --train)")
    demo.add_argument("--train", choices=["fedavg-xclp", "fedavg-per-site-lp", "fedavg-network", "fedavg"],
                      default=None, help="run a FedAvg training job instead of a prediction job (default: a prediction job)")
    demo.add_argument("--rounds", type=int, default=5, help="with --train: training rounds")
    demo.add_argument("--sites", type=int, default=3, help="number of site agents")
    demo.add_argument("--seed", type=int, default=0, help="seed of the data split")
    demo.add_argument("--json", type=Path, help="write the results as JSON to this file (default: none)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: the command stops, without a traceback
        print("xclp: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from cli.errors import one_line  # known errors (cli/errors.py): one line; anything else is a bug

        line = one_line(exc)
        if line is None:
            raise
        print(f"xclp: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
