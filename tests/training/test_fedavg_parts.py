"""FedAvg+XCLP's parts: the weighted loss, site sampling, averaging, pseudo-label refresh."""

import numpy as np
import pytest
import torch

from xclp.training.fedavg import (
    FedAvgConfig,
    PseudoLabels,
    Site,
    average_states,
    client_update,
    plan_round,
    sample_sites,
)
from xclp.training.models import build_network, weighted_cross_entropy
from xclp.training.simulation import run_fedavg


def test_weighted_loss_equals_hand_computation():
    logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-0.5, 1.5, 0.0], [1.0, 1.0, 1.0]])
    y = np.array([0, 2, 1, 2])
    w = np.array([1.0, 0.25, 0.5, 0.0])
    cw = np.array([0.5, 2.0, 1.5])
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    hand = np.mean([-logp[i, y[i]] * w[i] * cw[y[i]] for i in range(4)])
    got = weighted_cross_entropy(torch.tensor(logits), torch.tensor(y), torch.tensor(w), torch.tensor(cw))
    assert got.item() == pytest.approx(hand, rel=1e-12)
    plain = weighted_cross_entropy(torch.tensor(logits), torch.tensor(y), torch.ones(4))
    assert plain.item() == pytest.approx(np.mean(-logp[np.arange(4), y]), rel=1e-12)


@pytest.mark.parametrize("m_l, m_u, n, exp_l", [(8, 12, 5, 2), (10, 10, 4, 2), (1, 19, 5, 1), (2, 98, 5, 1),
                                                (5, 0, 3, 3), (3, 2, 10, 3)])
def test_sampling_in_proportion_with_at_least_one_labelled(m_l, m_u, n, exp_l):
    lab = [f"L{i}" for i in range(m_l)]
    unl = [f"U{i}" for i in range(m_u)]
    for seed in range(20):
        got = sample_sites(lab, unl, n, np.random.default_rng(seed))
        assert len(got) == len(set(got)) == min(n, m_l + m_u)
        assert sum(s.startswith("L") for s in got) == exp_l


def test_sampling_without_labelled_sites_is_refused():
    with pytest.raises(ValueError, match="no site holds labels"):
        sample_sites([], ["a", "b"], 2, np.random.default_rng(0))


def test_plan_round_labelled_only_and_warm_up_sample_labelled_sites_only():
    lab, unl = ["a", "c"], ["b"]
    only = plan_round(FedAvgConfig(algorithm="fedavg", sites_per_round=3), 1, lab, unl)
    assert only.sites == ["a", "c"] and not only.relabel and only.stage == 2
    warm = plan_round(FedAvgConfig(sites_per_round=3, warmup_rounds=2), 2, lab, unl)
    assert warm.sites == ["a", "c"] and warm.stage == 1 and not warm.relabel
    main = plan_round(FedAvgConfig(sites_per_round=3, warmup_rounds=2), 3, lab, unl)
    assert sorted(main.sites) == ["a", "b", "c"]
    assert main.stage == 2 and main.relabel and main.adopt == main.sites


def test_plan_round_refresh_schedule_and_uncached_sites():
    cfg = FedAvgConfig(sites_per_round=2, refresh=3)
    lab, unl = ["a", "b", "c", "d"], []
    first = plan_round(cfg, 1, lab, unl)
    assert first.relabel and first.adopt == first.sites  # round 1 is a scheduled refresh
    names = set(lab)
    # round 2 is not scheduled: only the sampled sites without labels yet adopt fresh ones
    second = plan_round(cfg, 2, lab, unl, cached=first.sites)
    assert second.adopt == [s for s in second.sites if s not in first.sites]
    assert second.relabel == bool(second.adopt)
    full = plan_round(cfg, 2, lab, unl, cached=names)
    assert not full.relabel and full.adopt == []
    assert plan_round(cfg, 4, lab, unl, cached=names).adopt  # rounds 1, 4, 7, … are scheduled


def test_plan_round_depends_on_seed_and_round_only():
    cfg = FedAvgConfig(sites_per_round=3, seed=7)
    lab = [f"s{i}" for i in range(10)]
    assert plan_round(cfg, 5, lab, []).sites == plan_round(cfg, 5, lab, []).sites
    draws = {tuple(plan_round(cfg, t, lab, []).sites) for t in range(1, 30)}
    assert len(draws) > 10  # rounds draw different sites
    assert plan_round(cfg, 1, lab, []).lr == cfg.lr and plan_round(cfg, 10, lab, []).lr < cfg.lr


def test_average_states_plain_and_weighted():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0])}
    assert torch.equal(average_states([a, b])["w"], torch.tensor([2.0, 4.0]))
    assert torch.allclose(average_states([a, b], [3, 1])["b"], torch.tensor([1.0]))


def test_client_update_ignores_unreached_points_and_returns_none_without_data():
    rng = np.random.default_rng(0)
    model = build_network("mlp", 4, 3, hidden=8, embed_dim=4)
    site = Site("s", rng.normal(size=(6, 4)).astype(np.float32), np.full(6, -1))
    none = PseudoLabels(np.full(6, -1), np.zeros(6))
    assert client_update(model, site, none, 3, 1, 0.1, 0.9, 0.0, rng) is None


def _toy_sites(rng, n_sites=3, n=40, d=8):
    centres = rng.normal(size=(3, d)) * 3
    sites = []
    for j in range(n_sites):
        y_true = rng.integers(0, 3, n)
        X = (centres[y_true] + rng.normal(size=(n, d))).astype(np.float32)
        y = np.full(n, -1)
        y[:4] = y_true[:4]
        sites.append(Site(f"site{j}", X, y, y_true))
    return sites, centres


def test_refresh_reuses_pseudo_labels_between_graph_rounds(monkeypatch):
    import xclp.training.simulation as fa  # the simulation's driver runs the run's XCLP jobs

    calls = []
    real = fa.run_xclp

    def counting(ds, params, seed=0, progress=None, **kw):
        calls.append(params.job_id)
        return real(ds, params, seed, **kw)

    monkeypatch.setattr(fa, "run_xclp", counting)
    rng = np.random.default_rng(0)
    sites, centres = _toy_sites(rng)
    test = (centres.astype(np.float32), np.arange(3))
    cfg = FedAvgConfig(algorithm="fedavg-xclp", rounds=3, sites_per_round=3, local_epochs=1, refresh=2, bits=256, k=3)
    run_fedavg(sites, test, 3, cfg)
    assert calls == ["fedavg-xclpr1", "fedavg-xclpr3"]  # the machine's child jobs: "<run>r<round>"
    calls.clear()
    run_fedavg(sites, test, 3, FedAvgConfig(**{**cfg.__dict__, "refresh": 1, "rounds": 2, "warmup_rounds": 1}))
    assert calls == ["fedavg-xclpr2", "fedavg-xclpr3"]  # stage 1 (round 1, labelled only) runs no XCLP


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="at least 2 sites"):
        FedAvgConfig(algorithm="fedavg-xclp", sites_per_round=1).validate()
    with pytest.raises(ValueError, match="algorithm"):
        FedAvgConfig(algorithm="fedprox").validate()
