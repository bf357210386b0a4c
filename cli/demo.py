"""`xclp demo`: the real system on one machine — a coordinator and N site agents as separate
processes on 127.0.0.1, a secure one-shot prediction job over the digits data, and the accuracy of
XCLP against per-site and centralized label propagation. `xclp demo --train ALGORITHM`: a FedAvg
training job instead, the agents training at home, against labelled-only FedAvg.

The demo keeps the true labels aside (they never reach the agents or the coordinator) and scores
each site's output file against them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _new_token() -> str:
    from service.sites_api import new_token  # (the service's rule: never a leading '-')

    return new_token()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def xclp_command() -> list[str]:
    return [sys.executable, "-m", "cli"]


def start_coordinator(workdir: Path, port: int, admin: str, database: str | None = None,
                      deadlines: dict | None = None, log_name: str = "coordinator.log",
                      tls: dict | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """`tls`: {"cert": PEM, "key": PEM} to serve HTTPS (--tls-cert, --tls-key); `extra`: more flags of
    `xclp coordinator serve`."""
    db = database or f"sqlite:///{workdir / 'coordinator.db'}"
    cmd = xclp_command() + ["coordinator", "serve", "--host", "127.0.0.1", "--port", str(port), "--database", db]
    if tls:
        cmd += ["--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"])]
    for phase, secs in (deadlines or {}).items():
        cmd += ["--deadline", f"{phase}={secs}"]
    cmd += list(extra)
    log = open(workdir / log_name, "ab")
    # Tokens travel in the environment, not on the command line, where every user sees them (ps).
    env = {**os.environ, "XCLP_ADMIN_TOKEN": admin}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root(), env=env)


def start_agent(workdir: Path, url: str, site: str, token: str, data: Path, out: Path,
                public: Path | None = None, options: list[str] | None = None) -> subprocess.Popen:
    """An agent process; `options` are extra `xclp agent run` flags (its policy, e.g. --allow-plaintext)."""
    log = open(workdir / f"agent-{site}.log", "ab")
    extra = ["--public", str(public)] if public is not None else []
    return subprocess.Popen(xclp_command() + ["agent", "run", "--coordinator", url, "--site", site,
                                              "--data", str(data), "--out", str(out), "--poll", "0.05",
                                              "--max-poll", "0.5", *extra,
                                              *(options or [])],
                            stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root(),
                            env={**os.environ, "XCLP_TOKEN": token})


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def wait_healthy(url: str, timeout: float = 60.0, ca_file: str | None = None) -> None:
    import httpx

    from clients.urls import check_url, verify_context

    url, verify = check_url(url, ca_file=ca_file), verify_context(ca_file)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"coordinator at {url} did not become healthy in {timeout} s")


class LocalCluster:
    """A coordinator and one agent process per site on 127.0.0.1, for the demos, the benchmarks and the
    end-to-end tests. `sites` maps each name to the arrays of its data file (X, y; the demos give no
    truth and no site column, as a real site's file would have). `database`: default SQLite in `work`;
    `public`: the file of FedCT's public set U the agents are started with; `start_agents=False`
    leaves starting them to the caller; `tls`: {"cert", "key", "ca"} PEM files, to serve HTTPS with
    cert and key and have the operator's client and the agents trust only the CA (--ca-file)."""

    def __init__(self, work: Path, sites: dict[str, dict[str, np.ndarray]], *, database: str | None = None,
                 admin_token: str | None = None, deadlines: dict | None = None, public: Path | None = None,
                 start_agents: bool = True, agent_options: list[str] | None = None, tls: dict | None = None,
                 coordinator_options: list[str] | None = None):
        from clients.api import CoordinatorClient

        self.work, self.database, self.deadlines, self.public = work, database, deadlines or {}, public
        self.agent_options = list(agent_options or [])
        self.coordinator_options = list(coordinator_options or [])  # more `xclp coordinator serve` flags
        self.data_files: dict[str, Path] = {}  # a site's data file other than <work>/<site>.npz (e.g. a CSV)
        self.admin_token = admin_token or _new_token()
        self.port = free_port()
        self.tls = tls
        self.ca_file = str(tls["ca"]) if tls else None
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}
        self.tokens: dict[str, str] = {}
        try:
            self.start_coordinator()
            self.admin = CoordinatorClient(self.url, self.admin_token, retries=20, ca_file=self.ca_file)
            for s, arrays in sites.items():
                np.savez(work / f"{s}.npz", **arrays)
                self.tokens[s] = self.admin.add_site(s)["token"]
            self.write_membership(list(sites))
            if start_agents:
                for s in sites:
                    self.start_agent(s)
        except BaseException:
            self.close()
            raise

    def start_coordinator(self) -> None:
        self.coordinator = start_coordinator(self.work, self.port, self.admin_token, self.database, self.deadlines,
                                             tls=self.tls, extra=tuple(self.coordinator_options))
        wait_healthy(self.url, 120, self.ca_file)

    @property
    def membership(self) -> Path:
        return self.work / "membership.json"

    def write_membership(self, sites: list[str]) -> None:
        """The consortium's membership file, as its operators would agree it: every site's identity
        fingerprint (each site's key made now in its --out, where its agent finds it). Each agent takes part
        only with these sites (--membership)."""
        from crypto.identity import Identity

        members = {}
        for s in sites:
            state = self.out(s) / ".agent-state"
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
            members[s] = Identity.load_or_create(state / "identity.key").fingerprint
        self.membership.write_text(json.dumps({"sites": members}, indent=1, sort_keys=True))

    def start_agent(self, s: str) -> None:
        data = self.data_files.get(s, self.work / f"{s}.npz")
        tls = ["--ca-file", self.ca_file] if self.ca_file else []
        self.agents[s] = start_agent(self.work, self.url, s, self.tokens[s], data, self.out(s),
                                     self.public, ["--membership", str(self.membership)] + self.agent_options + tls)

    def out(self, s: str) -> Path:
        return self.work / f"out-{s}"

    def result(self, job: str, site: str, timeout: float = 60.0) -> Path:
        """The site's output file for the job (it writes it right after the job is done)."""
        path = self.out(site) / f"{job}.npz"
        end = time.monotonic() + timeout
        while not path.exists() and time.monotonic() < end:
            time.sleep(0.05)
        return path

    def close(self) -> None:
        stop_processes([*self.agents.values(), self.coordinator])


def stop_processes(procs, timeout: float = 10) -> None:
    """End the processes this program started: SIGTERM to each still running (SIGCONT first: a stopped
    process must run to end), then SIGKILL to any still there after `timeout` seconds."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
    for p in live:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _opt_in(crypto: str) -> list[str] | None:
    """The demo's user runs every site: asking for a weaker protocol is also each site's opt-in to it."""
    from crypto.hamming_api import traits

    t = traits(crypto)
    return (["--allow-plaintext"] if not t.secure else []) + (["--allow-trusted-coordinator"]
                                                              if t.trusts_coordinator else []) or None


def _workdir(workdir: str | None) -> Path:
    work = Path(workdir or tempfile.mkdtemp(prefix="xclp-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    return work


def _cleanup(work: Path, workdir: str | None) -> None:
    if os.environ.get("XCLP_DEMO_KEEP") is None and workdir is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def run_demo(crypto: str = "lattice", json_out: Path | None = None, bits: int = 1024, sites: int = 3, seed: int = 0,
             workdir: str | None = None) -> int:
    from cli.progress import wait_for_job
    from xclp.baselines import centralized_lp, per_site_lp
    from xclp.data import load_arrays
    from xclp.simulation import unlabelled_accuracy
    from xclp.splits import simulate_sites

    t0 = time.perf_counter()
    work = _workdir(workdir)
    X, y = load_arrays("digits")
    ds = simulate_sites(X, y, sites, "dirichlet:0.5", 0.1, seed=seed)
    names = ds.sites
    print(f"xclp demo: {ds.n} digits over {sites} sites (Dirichlet β=0.5, 10% labelled), crypto={crypto}, "
          f"L={bits}; working in {work}", file=sys.stderr)
    cluster = None
    try:
        # The demo's user runs every site: asking for plaintext is also each site's opt-in to it.
        cluster = LocalCluster(work, {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in names},
                               agent_options=_opt_in(crypto))
        job = cluster.admin.submit_job(kind="predict", sites=names, crypto=crypto, bits=bits,
                                       classes=ds.n_classes)
        st = wait_for_job(cluster.admin, job, timeout=600)
        if st is None or st["status"] != "done":
            print(f"job {job} did not finish: {st and st['failure']}", file=sys.stderr)
            return 1
        labels = np.full(ds.n, -1)
        for s in names:
            labels[np.flatnonzero(ds.site == s)] = np.load(cluster.result(job, s))["labels"]
        seconds = time.perf_counter() - t0
        # scaled as the job scales (federated standardisation, the default): each site by its own
        # points' moments, the pooled reference by all points'
        base = {"per_site": per_site_lp(ds, standardize=True), "centralized": centralized_lp(ds, standardize=True)}
        acc = {"xclp": unlabelled_accuracy(ds, labels)} | {k: unlabelled_accuracy(ds, v) for k, v in base.items()}
        per_site = {s: {"xclp": unlabelled_accuracy(ds, labels, ds.site == s)}
                    | {k: unlabelled_accuracy(ds, v, ds.site == s) for k, v in base.items()} for s in names}
        print(f"\nsecure one-shot prediction job {job} ({crypto}), {seconds:.1f} s; phase seconds: {st['timings']}")
        print(f"{'site':<8}{'points':>8}{'labels':>8}{'xclp %':>10}{'per-site LP %':>15}{'centralized %':>15}")
        for s in names:
            m = ds.site == s
            r = per_site[s]
            print(f"{s:<8}{int(m.sum()):>8}{int((ds.y[m] >= 0).sum()):>8}{100 * r['xclp']:>10.2f}"
                  f"{100 * r['per_site']:>15.2f}{100 * r['centralized']:>15.2f}")
        print(f"{'all':<8}{ds.n:>8}{int((ds.y >= 0).sum()):>8}{100 * acc['xclp']:>10.2f}"
              f"{100 * acc['per_site']:>15.2f}{100 * acc['centralized']:>15.2f}")
        if json_out:
            Path(json_out).write_text(json.dumps({"crypto": crypto, "sites": sites, "job": job, "bits": bits,
                                                  "accuracy": acc, "per_site_accuracy": per_site,
                                                  "seconds": round(seconds, 3), "timings": st["timings"]}, indent=2))
        return 0
    finally:
        if cluster is not None:
            cluster.close()
        _cleanup(work, workdir)


def run_train_demo(algorithm: str = "fedavg-xclp", crypto: str = "lattice", json_out: Path | None = None, bits: int = 256,
                   sites: int = 3, rounds: int = 5, seed: int = 0, workdir: str | None = None) -> int:
    """A FedAvg training job through the coordinator, the agents training at home, its final model scored on
    held-out digits against labelled-only FedAvg simulated in process with the same data, rounds and seed."""
    from sklearn.model_selection import train_test_split

    from cli.progress import wait_for_job
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites
    from xclp.training.fedavg import FedAvgConfig, Site, accuracy
    from xclp.training.input_scaling import model_scaling
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg

    t0 = time.perf_counter()
    work = _workdir(workdir)
    X, y = load_arrays("digits")
    X = (X / 16.0).astype(np.float32)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
    ds = simulate_sites(Xtr, ytr, sites, "iid", 0.05, seed=seed)
    names = ds.sites
    knobs = dict(rounds=rounds, sites_per_round=sites, local_epochs=2, lr=0.1, bits=bits, seed=seed)
    print(f"xclp demo --train {algorithm}: {ds.n} digits over {sites} sites (iid, 5% labelled), {rounds} rounds, "
          f"crypto={crypto}, L={bits}; {len(yte)} held-out digits for testing; working in {work}", file=sys.stderr)
    cluster = None
    try:
        cluster = LocalCluster(work, {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in names},
                               agent_options=[*(_opt_in(crypto) or []), "--keep-rounds"])  # (its table scores each round's labels)
        job = cluster.admin.submit_train(algorithm=algorithm, sites=names, classes=ds.n_classes, crypto=crypto,
                                         **knobs)
        st = wait_for_job(cluster.admin, job, timeout=1200)
        if st is None or st["status"] != "done":
            print(f"job {job} did not finish: {st and st['failure']}", file=sys.stderr)
            return 1
        net = build_network("mlp", X.shape[1], ds.n_classes, seed=seed)
        state, meta = load_state(cluster.admin.model(job), net.state_dict())
        net.load_state_dict(state)
        seconds = time.perf_counter() - t0
        site_data = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s]) for s in names]
        base = run_fedavg(site_data, (Xte, yte), ds.n_classes, FedAvgConfig(algorithm="fedavg", **knobs))
        # the run standardised its model's inputs (xclp.training.input_scaling): the held-out digits go
        # through the same scaling, which the coordinator serves with the model
        scaling = model_scaling(meta)
        Xin = Xte if scaling is None else scaling.apply(Xte)
        acc = {algorithm: accuracy(net, Xin, yte), "fedavg": base["final_accuracy"]}
        hist = st["training"]["history"]
        print(f"\ntraining job {job} ({algorithm}, {crypto}), {len(hist)} rounds, {seconds:.1f} s")
        print(f"{'round':>5}{'sites':>7}{'left out':>10}{'pseudo-label acc %':>20}{'seconds':>9}")
        for r in hist:
            # The agents never saw the truth: the demo scores the pseudo-labels each site kept at home.
            r["pseudo_label_accuracy"] = _pseudo_label_accuracy(cluster, ds, r.get("xclp_job"))
            pl = r["pseudo_label_accuracy"]
            print(f"{r['round']:>5}{len(r['sites']):>7}{len(r['left_out']):>10}"
                  f"{'–' if pl is None else f'{100 * pl:.2f}':>20}{r['seconds']:>9.1f}")
        print(f"test accuracy of the final model: {100 * acc[algorithm]:.2f} % (service, {algorithm}) vs "
              f"{100 * acc['fedavg']:.2f} % (labelled-only FedAvg, same data, rounds and seed, in process)")
        if json_out:
            Path(json_out).write_text(json.dumps({"algorithm": algorithm, "crypto": crypto, "sites": sites,
                                                  "job": job, "bits": bits, "rounds": rounds, "accuracy": acc,
                                                  "history": hist, "seconds": round(seconds, 3)}, indent=2))
        return 0
    finally:
        if cluster is not None:
            cluster.close()
        _cleanup(work, workdir)


def _pseudo_label_accuracy(cluster: LocalCluster, ds, child: str | None) -> float | None:
    """Accuracy of a round's XCLP pseudo-labels on the sites' unlabelled points (from each site's own
    output file of the round's child job), or None where the round had none."""
    if child is None:
        return None
    hit = tot = 0
    for s in ds.sites:
        path = cluster.result(child, s, timeout=0)
        if not path.exists():
            continue
        m = ds.site == s
        labels, unl = np.load(path)["labels"], ds.y[m] < 0
        hit += int((labels[unl] == ds.y_true[m][unl]).sum())
        tot += int(unl.sum())
    return hit / tot if tot else None
