"""FedCT (+XCLP) rounds inside Flower: the same strategy (xclp/training/fedct.py) whose hooks the
coordinator's engine and the simulation call — `configure_round` and `aggregate` here in the
ServerApp, `update` in each site's ClientApp (`@app.train("fedct")`).

A round: the ServerApp sends each planned site the previous consensus on the public set U; the site
trains its own model one step on its private data ∪ that consensus (∪ its XCLP pseudo-labels) and
answers with its hard labels on U only; the ServerApp forms the next consensus. With fedct-xclp an
XCLP job (xclp_flower.server_app.FlowerXCLP, over the raw features) labels every site's points before
round 1. A site's model lives between messages in its node-local Context.state (pickled: the
site's own model, never sent); its data stay in its files. The sites' copies of U must have the
digest the run pins (run config `public-sha256`), checked at every site before anything else.
"""

from __future__ import annotations

import io
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from xclp.protocol import JobParams
from xclp.training.algorithms import STRATEGIES, strategy_for
from xclp.training.strategy import Roster

TRAIN_TYPE = "train.fedct"
ALGORITHMS = ("fedct", "fedct-xclp")


class FlowerFedCT:
    """One FedCT run over the Grid's nodes (every node a site); the rounds' records as it goes."""

    def __init__(self, grid: Grid, algorithm: str, options: dict, n_classes: int, public_sha256: str, public_size: int,
                 timeout: float = 600.0, say: Callable[[str], None] | None = None, nodes: int = 2, run_id: int = 0):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS} inside Flower, got {algorithm!r}")
        self.grid, self.algorithm, self.n_classes = grid, algorithm, int(n_classes)
        self.public_sha256, self.public_size = public_sha256, int(public_size)
        self.timeout, self.nodes, self.run_id = timeout, nodes, run_id
        self.say = say or (lambda _m: None)
        self.options = dict(options)
        self.history: list[dict] = []

    def run(self) -> dict:
        from xclp_flower.server_app import FlowerXCLP, SiteFailed

        xclp = FlowerXCLP(self.grid, JobParams(job_id=f"flower-{self.run_id}-xclp", n_classes=self.n_classes,
                                               crypto=self.options.get("crypto", "lattice"),
                                               bits=int(self.options.get("bits", 1024)), k=int(self.options.get("k", 10))),
                          self.timeout, self.say, self.nodes)
        sites = xclp.connect()  # the sites' names and their nodes (the announce round); hello below
        hello = xclp.round_to_sites("hello", {s: {"public_sha256": self.public_sha256, "classes": self.n_classes}
                                              for s in sites}, message_type=TRAIN_TYPE)
        labelled = [s for s in sites if int(hello[s]["labelled"]) > 0]
        if not labelled:
            raise SiteFailed("no site holds labels: nothing to learn from")
        config = asdict(STRATEGIES[self.algorithm].config_from_options(self.algorithm, self.options, len(sites)))
        s = strategy_for(self.algorithm, config, self.n_classes, len(sites), n_public=self.public_size)
        shared = None
        if s.cfg.xclp:
            self.say("xclp: labelling every site's points before round 1")
            xclp.run(connected=True)
        for t in range(1, s.total_rounds() + 1):
            t0 = time.perf_counter()
            plan = s.configure_round(t, Roster(sites, labelled, [x for x in sites if x not in labelled]))
            body = b"" if shared is None else s.dump_broadcast(shared)
            back = xclp.round_to_sites("round", {x: {"round": t, "config": json.dumps(config), "consensus": body,
                                                     "sites": sites, "classes": self.n_classes} for x in plan["sites"]},
                                       message_type=TRAIN_TYPE)
            uploads, metrics = [], {}
            for x in plan["sites"]:
                votes, meta = s.load_upload(bytes(back[x]["votes"]), what=f"votes from {x}")
                metrics[x] = meta
                if (c := s.contribution(votes, meta)) is not None:
                    uploads.append(c)
            shared = s.aggregate(t, plan, uploads, shared)
            row = {"round": t, **s.summarize(plan, metrics, shared), "seconds": round(time.perf_counter() - t0, 3)}
            self.history.append(row)
            self.say(f"round {t}: {row}")
        done = xclp.round_to_sites("finish", {x: {"config": json.dumps(config), "sites": sites,
                                                  "classes": self.n_classes} for x in sites},
                                   message_type=TRAIN_TYPE)
        return {"algorithm": self.algorithm, "sites": sites, "history": self.history,
                "written": {x: str(done[x]["written"]) for x in sites}, "bytes": dict(xclp.bytes_by_phase)}


# --- the site's side ---------------------------------------------------------------------------------

def site_round(site, step: ConfigRecord, state_record: ConfigRecord | None, xclp_labels) -> tuple[ConfigRecord, bytes]:
    """One FedCT step at a site (`site`: the ClientApp's FlowerSite): (reply, the site's state to keep)."""
    from clients.trainer import eval_metrics, pseudo_metrics
    from xclp.training.fedavg import Site
    from xclp.training.fedct import new_site_state

    name = str(step["step"])
    public = site.public()
    if name == "hello":
        public.verify(str(step["public_sha256"]))
        return ConfigRecord({"labelled": int((site.y >= 0).sum()), "n": int(site.y.size)}), b""
    config = json.loads(str(step["config"]))
    sites = list(step["sites"])
    algorithm = "fedct-xclp" if config.get("xclp") else "fedct"
    s = strategy_for(algorithm, config, int(site.classes), len(sites), n_public=len(public.X))
    data = Site(site.name, site.X.astype(np.float32), site.y, None)
    if state_record is None:
        state = new_site_state(data, s.cfg.learner_names(len(sites))[sites.index(site.name)], sites.index(site.name),
                               int(site.classes), public.digest, s.cfg)
    else:
        state = pickle.loads(bytes(state_record))  # noqa: S301 — this node's own state, written below
        state.site = data
    if xclp_labels is not None and state.xclp_labels is None:
        state.xclp_labels, state.xclp_weights = xclp_labels
    if name == "finish":
        labels = np.asarray(state.learner.predict(site.X.astype(np.float32)), dtype=np.int64)
        path = site.write_result(f"flower-fedct-{site.run_id}", labels=labels, confidence=np.ones(labels.size),
                                 model=pickle.dumps(state.learner))
        return ConfigRecord({"written": str(path)}), _keep(state)
    t = int(step["round"])
    consensus = None if not bytes(step["consensus"]) else s.load_broadcast(bytes(step["consensus"]))
    votes, mix = s.update(state, public, consensus, t)
    # what a site tells the server about a round, as the service's agents do: counts, never points
    metrics = {"mix": mix, **eval_metrics(site.X, site.y_true if site.y_true is not None else site.y,
                                          lambda X: np.asarray(state.learner.predict(X))),
               **pseudo_metrics(site.y, site.y_true, state.xclp_labels, state.xclp_weights)}
    return ConfigRecord({"votes": s.dump_upload(votes, metrics)}), _keep(state)


def _keep(state) -> bytes:
    data, state.site = state.site, None  # the data stay in the site's files; the pickle holds its model
    try:
        buf = io.BytesIO()
        pickle.dump(state, buf)
        return buf.getvalue()
    finally:
        state.site = data


