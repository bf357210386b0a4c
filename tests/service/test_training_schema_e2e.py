"""A training job on a real-looking table through real processes (issue 34, part 2): a coordinator and three
agent processes, each reading its CSV (text categories, empty cells, grams and years) ONLY through the
consortium's schema file; the job standardises the model's inputs by its secure sum at setup and ends
within 2 points of the same job on hand-standardised features; `xclp job wait` exits 0 (not collapsed)."""

import numpy as np
import pytest
from penguins_table import SITES, penguins_tables
from svc import ADMIN, ProcessCluster, cluster_fixture

from xclp.datafile import Columns, load_data_file
from xclp.schema import Schema, with_schema
from xclp.training.fedavg import FedAvgConfig, Site
from xclp.training.models import predict_proba_array
from xclp.training.simulation import run_fedavg

pytestmark = pytest.mark.slow

cluster_factory = cluster_fixture(ProcessCluster)
JOB = dict(rounds=15, sites_per_round=3, local_epochs=5, lr=0.1, seed=1)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_fedavg_job_on_a_schema_read_table_matches_hand_standardised_features(cluster_factory, tmp_path, capsys):
    from cli.main import main

    schema_file, truths = penguins_tables(tmp_path)
    empty = {"X": np.zeros((1, 1)), "y": np.zeros(1, dtype=np.int64)}  # (the cluster's .npz files are not used)
    c = cluster_factory(sites={s: empty for s in SITES},
                        agent_options=("--allow-plaintext", "--schema", str(schema_file)))
    for s in SITES:
        c.data_files[s] = tmp_path / f"{s}.csv"
        c.start_agent(s)
    job = c.admin.submit_train(algorithm="fedavg", sites=SITES, classes=3, holdout=0.0, **JOB)
    st = c.wait_done(job, timeout=600)
    assert st["training"]["final"]["collapsed"] == []
    # the sites' own labels for their unlabelled rows, against their truth
    cols = with_schema(Columns(), Schema.load(schema_file))
    data = {s: load_data_file(tmp_path / f"{s}.csv", cols, require_site=False) for s in SITES}
    right = total = 0
    for s in SITES:
        labels = np.load(c.result(job, s))["labels"]
        m = data[s]["y"] < 0
        right, total = right + int((labels[m] == truths[s][m]).sum()), total + int(m.sum())
    got = right / total
    # the same job in process on features standardised by hand over all sites' rows
    pooled = np.concatenate([data[s]["X"] for s in SITES])
    mu, sd = pooled.mean(axis=0), pooled.std(axis=0)
    sd[sd == 0] = 1.0
    sites = [Site(s, ((data[s]["X"] - mu) / sd).astype(np.float32), data[s]["y"].astype(np.int64), truths[s])
             for s in SITES]
    ref = run_fedavg(sites, (sites[0].X, truths[SITES[0]]), 3,
                     FedAvgConfig(algorithm="fedavg", secure_aggregation=True, standardize=False, threads=1, **JOB))
    X = np.concatenate([x.X[x.y < 0] for x in sites])
    y = np.concatenate([x.y_true[x.y < 0] for x in sites])
    want = float(np.mean(predict_proba_array(ref["model"], X).argmax(axis=1) == y))
    assert want > 0.8 and abs(got - want) <= 0.02, (got, want)
    capsys.readouterr()
    code = main(["job", "wait", job, "--coordinator", c.url, f"--admin-token={ADMIN}", "--quiet"])
    assert code == 0, capsys.readouterr()
    with capsys.disabled():
        print(f"\nthrough the service, schema-read raw table: {got:.4f}; in process, hand-standardised: {want:.4f}")
