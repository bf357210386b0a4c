"""Training on a real table (issue 34, part 2): the model's inputs standardised by the secure sum at setup
(xclp.training.input_scaling), the divergence guard's one line, and a collapsed final model flagged.

The table is penguins-like (tests/penguins_table.py): three species, bill length and depth and flipper length in mm,
body mass in grams (~4,000), the year (~2008), island and sex as text with empty cells; three sites,
a few labels each, read ONLY through a schema file (xclp.schema)."""

import logging
from dataclasses import replace

import numpy as np
import pytest
from penguins_table import SITES, penguins_tables

from crypto.fixedpoint import from_limbs
from crypto.keys import SiteKeyPair
from xclp.datafile import Columns, load_data_file
from xclp.schema import Schema, with_schema
from xclp.standardisation import STATS_FRAC_BITS
from xclp.training import input_scaling
from xclp.training.fedavg import FedAvgConfig, Site
from xclp.training.input_scaling import Scaling, masked_stats, read_total, sum_stats
from xclp.training.simulation import run_fedavg
from xclp.wire import load_array


def schema_sites(tmp_path) -> list[Site]:
    schema_file, truths = penguins_tables(tmp_path)
    cols = with_schema(Columns(), Schema.load(schema_file))
    out = []
    for site in SITES:
        d = load_data_file(tmp_path / f"{site}.csv", cols, require_site=False)
        out.append(Site(site, d["X"].astype(np.float32), d["y"].astype(np.int64), truths[site]))
    return out


def fedavg_config(**kw) -> FedAvgConfig:
    base = dict(algorithm="fedavg", rounds=15, sites_per_round=3, local_epochs=5, lr=0.1, seed=1, model="mlp",
                threads=1)
    return FedAvgConfig(**{**base, **kw})


def unlabelled_accuracy(sites, out) -> float:
    """The final model's accuracy on every site's unlabelled points (their truth never trained on)."""
    from xclp.training.models import predict_proba_array

    X = np.concatenate([s.X[s.y < 0] for s in sites])
    y = np.concatenate([s.y_true[s.y < 0] for s in sites])
    inputs = X if out["scaling"] is None else out["scaling"].apply(X)
    return float(np.mean(predict_proba_array(out["model"], inputs).argmax(axis=1) == y))


# --- (a) the secure sum gives the pooled μ, σ; the coordinator sees masked values only -----------------

def test_the_masked_standardisation_sum_gives_the_pooled_mean_and_std_and_no_site_in_the_clear():
    rng = np.random.default_rng(3)
    X = {s: np.column_stack([rng.normal(4000, 400, n), rng.normal(2008, 1, n), np.full(n, 7.0)])
         for s, n in zip(SITES, (40, 55, 25))}
    keys = {s: SiteKeyPair.generate() for s in SITES}
    public = {s: k.public_bytes() for s, k in keys.items()}
    shares = {s: masked_stats(X[s], me=s, private=keys[s], public_keys=public, participants=SITES, job="j",
                              attempt=0) for s in SITES}
    total = sum_stats(list(shares.values()), 3)
    scaling = Scaling.from_total(total, 3)
    pooled = np.concatenate(list(X.values()))
    # exact to the fixed point: each sum is exact to 2^-32 per term, μ and σ follow
    assert np.allclose(scaling.mean, pooled.mean(axis=0), rtol=0, atol=1e-6)
    assert np.allclose(scaling.std[:2], pooled.std(axis=0)[:2], rtol=1e-9, atol=1e-6)
    assert scaling.std[2] == 1.0  # a constant feature keeps σ = 1 (and is only centred)
    assert read_total(total, 3)[0] == 120
    scaled = scaling.apply(pooled)
    assert np.allclose(scaled[:, :2].mean(axis=0), 0, atol=1e-5) and np.allclose(scaled[:, :2].std(axis=0), 1, atol=1e-4)
    for s, body in shares.items():  # what the coordinator holds of one site: uniform, not the site's sums
        alone = from_limbs(load_array(body, dtype=np.uint64), STATS_FRAC_BITS)
        assert alone[0] != len(X[s]) and not np.allclose(alone[1:4], X[s].sum(axis=0), rtol=1e-3)
    # masks over other participants than the sum's do not cancel: the coordinator's count check refuses it
    wrong = masked_stats(X["c"], me="c", private=keys["c"], public_keys=public, participants=["a", "c"], job="j",
                         attempt=0)
    bad = read_total(sum_stats([shares["a"], shares["b"], wrong], 3), 3)[0]
    with pytest.raises(Exception, match="do not count"):
        input_scaling.check_points(bad, 120)


def test_a_site_masks_only_in_a_sum_with_another_and_restarts_only_over_fewer_sites():
    keys = {s: SiteKeyPair.generate() for s in SITES}
    public = {s: k.public_bytes() for s, k in keys.items()}
    with pytest.raises(Exception, match="at least one other"):
        masked_stats(np.ones((3, 2)), me="a", private=keys["a"], public_keys=public, participants=["a"], job="j",
                     attempt=0)
    record: dict = {}
    input_scaling.claim(record, "a", 0, SITES)
    input_scaling.claim(record, "a", 0, SITES)  # the same ask again: the same message
    with pytest.raises(Exception, match="fewer sites"):
        input_scaling.claim(record, "a", 1, SITES)  # a restart over the same sites would difference a site out
    input_scaling.claim(record, "a", 1, ["a", "b"])


# --- (b) a mixed-type table through the schema: as good as hand-standardised ----------------------------

def test_fedavg_on_a_raw_scale_mixed_type_table_through_the_schema_matches_hand_standardised_features(tmp_path):
    sites = schema_sites(tmp_path)
    assert sites[0].X.shape[1] == 11 and np.nanmax(sites[0].X[:, 3]) > 3000  # grams and years, raw
    out = run_fedavg(sites, (sites[0].X, sites[0].y_true), 3, fedavg_config())
    pooled = np.concatenate([s.X for s in sites])
    mu, sd = pooled.mean(axis=0), pooled.std(axis=0)
    sd[sd == 0] = 1.0
    by_hand = [replace(s, X=((s.X - mu) / sd).astype(np.float32)) for s in sites]
    ref = run_fedavg(by_hand, (by_hand[0].X, by_hand[0].y_true), 3, fedavg_config(standardize=False))
    got, want = unlabelled_accuracy(sites, out), unlabelled_accuracy(by_hand, ref)
    print(f"schema + federated standardisation {got:.4f}; hand-standardised {want:.4f}")
    assert want > 0.8  # the task is learnable from a few labels once scaled
    assert abs(got - want) <= 0.02
    assert np.allclose(out["scaling"].mean, mu, atol=1e-3)


def test_without_the_standardisation_the_raw_table_does_not_train(tmp_path):
    """The fault the standardisation fixes, planted: the same job on raw grams and years either diverges
    (the guard's line) or ends no better than the majority class."""
    sites = schema_sites(tmp_path)
    try:
        out = run_fedavg(sites, (sites[0].X, sites[0].y_true), 3, fedavg_config(standardize=False))
    except ValueError as exc:
        assert "diverged" in str(exc) and "lower --lr" in str(exc)
    else:
        majority = max(np.mean(np.concatenate([s.y_true[s.y < 0] for s in sites]) == c) for c in range(3))
        assert unlabelled_accuracy(sites, out) <= majority + 0.05


# --- (c) the divergence guard -----------------------------------------------------------------------

def test_a_huge_learning_rate_fails_the_job_with_one_line_naming_round_site_and_what_to_change(tmp_path):
    sites = schema_sites(tmp_path)
    with pytest.raises(ValueError) as err:
        run_fedavg(sites, (sites[0].X, sites[0].y_true), 3, fedavg_config(lr=1e6, rounds=3))
    msg = str(err.value)
    assert "\n" not in msg
    assert "round 1, site a: the model diverged" in msg and "lower --lr (now 1e+06)" in msg and "--standardize" in msg


def test_the_guard_names_non_finite_and_exploded_weights():
    import torch

    from xclp.training.divergence import Diverged, check

    check({"w": torch.ones(3)}, where="round 2, site a")  # a sane model passes
    with pytest.raises(Diverged, match="round 2, site a: the model diverged, non-finite"):
        check({"w": torch.tensor([1.0, float("nan")])}, where="round 2, site a")
    with pytest.raises(Diverged, match="weights of magnitude 3.93e\\+07 exceed 10000"):
        check({"w": torch.tensor([3.93e7])}, where="round 2, site a")


# --- (d) a collapsed model flagged ------------------------------------------------------------------

def test_a_final_model_that_predicts_one_class_is_flagged_in_the_result_and_the_sites_log(tmp_path, caplog):
    from xclp.training.simulation import SimWork

    sites = schema_sites(tmp_path)
    real = SimWork.evaluate

    def one_class(self, s, t, inbox):  # the planted fault: a final model that says "Adelie" for every point
        from xclp.training.site_metrics import eval_metrics

        site = self.env.site
        return s.site_statistics(eval_metrics(site.X, site.y, site.y_true, lambda X: np.zeros(len(X), dtype=int)))

    from xclp.training.fedavg import FedAvgStrategy
    from xclp.training.simulation import simulate, spec_for

    cfg = fedavg_config(rounds=3)
    s = FedAvgStrategy(cfg, 3, sites[0].X.shape[1])
    ok = simulate(spec_for(s), sites, seed=1).state.final
    assert ok["collapsed"] == []  # a model that learnt is not flagged
    SimWork.evaluate = one_class
    try:
        with caplog.at_level(logging.WARNING, logger="xclp.training"):
            final = simulate(spec_for(s), sites, seed=1).state.final
    finally:
        SimWork.evaluate = real
    assert final["collapsed"] == SITES
    assert all(m["eval_correct"] <= m["eval_majority"] for m in final["site_metrics"].values())
    assert any("no better than the majority class" in r.getMessage() for r in caplog.records)


def test_job_wait_exits_5_and_names_the_sites_where_the_training_model_collapsed(monkeypatch, capsys):
    import cli.main as cli_main
    import cli.progress

    final = {"collapsed": ["b"], "local_accuracy": 0.31}
    status = {"job": "j", "status": "done", "dropped": {}, "kind": "train", "training": {"final": final}}
    monkeypatch.setattr(cli.progress, "wait_for_job", lambda *a, **k: status)
    monkeypatch.setattr(cli_main, "_admin", lambda args: None)
    args = cli_main.build_parser().parse_args(["job", "wait", "j", "--coordinator", "http://127.0.0.1:1"])
    assert cli_main.cmd_job_wait(args) == cli_main.WAIT_COLLAPSED == 5
    assert "no better than the majority class at b" in capsys.readouterr().err
    final["collapsed"] = []
    assert cli_main.cmd_job_wait(args) == 0
    status["dropped"] = {"c": "round"}  # a dropped site wins: 4
    final["collapsed"] = ["b"]
    assert cli_main.cmd_job_wait(args) == cli_main.WAIT_DROPPED
