"""One training order: the same FedAvg job with secure aggregation, with the same site vanishing after
its setup (its hello and its share of the standardisation sum), run through the core's machines in memory (xclp.training_job: nothing but the machines and a
dict of messages), through the coordinator's engine with its agents (the real app, real Agent
objects, HTTP, the database, state files) and through Flower in process (the ServerApp's
FlowerTraining and each node's ClientApp, their Context.state carried through Flower's own
serialisation). All leave the site out of the same rounds, drop it after the same strike, recover each
masked sum by its unmask step, and end with the same model, bit for bit: the engine, the agent and
Flower are the machines' transports and decide nothing of the order.

The simulation (xclp.training.simulation: the same machines over a MemoryMailbox, each site's work its
strategy's site hook) is the fourth."""

import json
import time
from dataclasses import asdict

import numpy as np
import torch
from fastapi.testclient import TestClient
from svc import ADMIN, expire_deadline
from training_helpers import FedAvgWork

from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox
from xclp.training.algorithms import STRATEGIES, strategy_for
from xclp.training.fedavg import Site
from xclp.training.input_scaling import Scaling
from xclp.training.messages import load_state
from xclp.training_job import BROADCAST, MailboxInbox, RunSpec, TrainCoordinator, TrainSite, TrainState

SITES = ["site0", "site1", "site2"]
GONE = "site2"
OPTIONS = {"rounds": 3, "sites_per_round": 3, "local_epochs": 2, "lr": 0.1, "seed": 4, "secure_aggregation": True,
           "holdout": 0.0}  # every labelled point trains (the held-out points: tests/training/test_holdout.py)
MAX_MISSED = 2


def data(i: int) -> Site:
    rng = np.random.default_rng(10 + i)
    X = rng.normal(size=(24, 5)).astype(np.float32)
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(np.int64)
    y[12:] = -1
    return Site(SITES[i], X, y)


def in_memory():
    config = asdict(STRATEGIES["fedavg"].config_from_options("fedavg", OPTIONS, len(SITES)))
    spec = RunSpec("mem", "fedavg", config, 2, max_missed=MAX_MISSED)
    mail, coord = MemoryMailbox(), TrainCoordinator(spec, TrainState.new(SITES))
    sites = {x: TrainSite(x, spec, FedAvgWork(data(i)), n_features=5) for i, x in enumerate(SITES)}
    for _ in range(100):
        st = coord.state
        if st.status != "running":
            break
        before = st.to_bytes()
        moved = False
        for x, site in sites.items():
            if x != GONE or st.phase == "setup":  # silent after its hello
                moved |= site.step(st, MailboxInbox(mail, x), mail.put)
        for m in coord.run(mail):
            mail.put(m)
        if not moved and coord.state.to_bytes() == before:
            for m in coord.run(mail, expired=True):  # nothing moves but the clock: the deadline passed
                mail.put(m)
    st = coord.state
    model = coord.strategy().load_broadcast(mail.body(COORDINATOR, BROADCAST, f"model/{st.history[-1]['round']}"))
    return (st.status, st.dropped, [(h["round"], h["sites"], h["left_out"], h["decoded"]) for h in st.history], model,
            coord.refusals(mail))


def through_the_service(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 't.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents = {}
        for i, s in enumerate(SITES):
            token = admin.add_site(s)["token"]
            d = data(i)
            np.savez(tmp_path / f"{s}.npz", X=d.X, y=d.y)
            agents[s] = Agent(CoordinatorClient("http://testserver", token, transport=tc._transport), s,
                              tmp_path / f"{s}.npz", tmp_path / f"out-{s}", trust_on_first_use=True)
        job = admin.submit_train(algorithm="fedavg", sites=SITES, classes=2, max_missed_rounds=MAX_MISSED,
                                 **OPTIONS)  # holdout=0 among them
        last, still, end = None, 0, time.monotonic() + 120
        while time.monotonic() < end:
            st = admin.job(job)
            if st["status"] != "running":
                break
            for s, a in agents.items():
                # silent once its setup is sent (its agent, not the job's phase read here: the engine may
                # move on between this read and the agent's own, and the site would answer round 1)
                if s != GONE or not a.state(job).get("sent:coordinator:stats/0"):
                    a.step(job)
            now = (st["phase"], st["round"], tuple(st["live"]), st["progress"]["received"],
                   tuple((st.get("training") or {}).get("survivors") or []))
            still = still + 1 if now == last else 0
            last = now
            if still >= 10:  # every other site's part is in, the silent one's never comes: the deadline passes
                expire_deadline(tc.app.state.sessionmaker, job)
                still = 0
            time.sleep(0.01)
        st = admin.job(job)
        s = strategy_for("fedavg", st["params"]["config"], 2, len(SITES), n_features=5)
        model, meta = load_state(admin.model(job), s.network().state_dict())
        # the model comes with the run's scaling of its inputs: the μ, σ every site applied (its record),
        # and the file each site wrote beside its own copy of the model
        kept = agents[SITES[0]].state(job)["scaling"]
        assert meta["scaling"] == kept and Scaling.from_json(kept) is not None
        for x in SITES[:2]:
            agents[x].step(job)  # the job is done: the site writes its labels, its model and the model's scaling
            assert json.loads((tmp_path / f"out-{x}" / f"{job}.scaling.json").read_text()) == kept
        hist = st["training"]["history"]
        return (st["status"], st["dropped"], [(h["round"], h["sites"], h["left_out"], h["decoded"]) for h in hist],
                model, st["refused"])


def through_flower(tmp_path):
    import pytest

    pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]'")
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.training import FlowerTraining

    configs = []
    for i, s in enumerate(SITES):
        d = data(i)
        np.savez(tmp_path / f"flower-{s}.npz", X=d.X, y=d.y)
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp_path / f"flower-{s}.npz"), "out": str(tmp_path / f"fl-{s}")})
    grid = InProcessGrid(client_app, configs)
    # its node answers "who", the run's start (its hello) and the standardisation sum
    grid.vanish_after = {100 + SITES.index(GONE): 3}
    out = FlowerTraining(grid, "fedavg", OPTIONS, 2, max_missed=MAX_MISSED).run()
    st = out["state"]
    s = strategy_for("fedavg", st_config(OPTIONS), 2, len(SITES), n_features=5)
    with open(out["written"][SITES[0]].replace(".npz", ".model.npz"), "rb") as f:
        model = load_state(f.read(), s.network().state_dict())[0]
    return st["status"], st["dropped"], [(h["round"], h["sites"], h["left_out"], h["decoded"]) for h in st["history"]], model


def st_config(options: dict) -> dict:
    return asdict(STRATEGIES["fedavg"].config_from_options("fedavg", options, len(SITES)))


def through_the_simulation():
    from xclp.training.simulation import simulate

    config = asdict(STRATEGIES["fedavg"].config_from_options("fedavg", OPTIONS, len(SITES)))
    spec = RunSpec("sim", "fedavg", config, 2, max_missed=MAX_MISSED)
    run = simulate(spec, [data(i) for i in range(len(SITES))], seed=OPTIONS["seed"], silent={GONE: "round"})
    st = run.state
    return (st.status, st.dropped, [(h["round"], h["sites"], h["left_out"], h["decoded"]) for h in st.history],
            run.shared(st.history[-1]["round"]))


def test_the_same_left_out_rounds_strike_and_model_through_the_machines_and_the_service(tmp_path):
    status, dropped, rounds, model, why = in_memory()
    assert status == "done" and dropped == {GONE: "round"}
    # left out of rounds 1 and 2 (each sum recovered by its unmask step), dropped at its second strike,
    # which the operator reads as the rule that dropped it (the phase alone is what `dropped` says)
    assert rounds == [(1, SITES, [GONE], True), (2, SITES, [GONE], True), (3, SITES[:2], [], True)]
    assert why == {GONE: "left out by the coordinator: missed 2 rounds in a row"}
    service = through_the_service(tmp_path)
    assert service[4] == why
    for got in (through_the_simulation(), service, through_flower(tmp_path)):
        assert got[:3] == (status, dropped, rounds)
        assert all(torch.equal(got[3][k], model[k]) for k in model)
