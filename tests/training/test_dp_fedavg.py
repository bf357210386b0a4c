"""DP-FedAvg (xclp.privacy.gaussian_shares, the FedAvg strategy): clipped updates, Gaussian noise
shares that survive the masks, the Gaussian ledger against dp-accounting, budgets calibrated and
refused, and accounting by the sites whose shares are in the sum."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from crypto.keys import SiteKeyPair
from xclp.privacy import gaussian_shares as gs
from xclp.privacy.ledger import SITE_LEVEL, PrivacyLedger, epsilon_of, gaussian_epsilon
from xclp.training import secure_aggregation as secagg
from xclp.training.fedavg import FedAvgConfig, FedAvgStrategy, clip_update
from xclp.training.runner import run_training


def _state(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(6, 4, generator=g) * scale, "b": torch.randn(4, generator=g) * scale}


def test_noise_shares_survive_the_masks_and_nothing_else_does():
    sites = ["a", "b", "c"]
    keys = {s: SiteKeyPair.generate() for s in sites}
    public = {s: k.public_bytes() for s, k in keys.items()}
    template = _state(0)
    states = {s: _state(i + 1) for i, s in enumerate(sites)}
    shares = {s: gs.noise_share(secagg.n_values(template), 0.3, secagg.FRAC_BITS, key=bytes([i]) * 32)
              for i, s in enumerate(sites)}
    masked = [secagg.masked_update(states[s], template, me=s, private=keys[s], public_keys=public, participants=sites,
                                   job="j", t=1, attempt=0, noise=shares[s]) for s in sites]
    total = np.zeros(secagg.n_values(template), dtype=np.uint64)
    for m in masked:
        total += m
    clear = sum(secagg.encode_update(states[s], template) for s in sites) + sum(shares.values())
    assert np.array_equal(total, clear)  # the masks cancel exactly; the shares stay, bit for bit
    noisy = secagg.mean_from_total(total, 3, template)
    plain = secagg.quantized_mean(list(states.values()))
    diff = np.concatenate([(noisy[k] - plain[k]).numpy().ravel() for k in plain])
    assert 0 < np.abs(diff).max() < 3 * 0.3 * 4  # the average moved by the noise: σ = √3·0.3/3 per weight


def test_a_share_is_gaussian_on_the_fixed_point_grid():
    share = gs.noise_share(50_000, 0.25, secagg.FRAC_BITS, key=b"s" * 32).view(np.int64) / 2.0**secagg.FRAC_BITS
    assert share.std() == pytest.approx(0.25, rel=0.02) and abs(share.mean()) < 0.01
    assert not np.array_equal(gs.noise_share(10, 1.0, 32), gs.noise_share(10, 1.0, 32))  # os.urandom: fresh


def test_updates_are_clipped_to_their_bound():
    start, state = _state(0), _state(1, scale=5.0)
    clipped = clip_update(state, start, 1.0)
    norm = math.sqrt(sum(float(((clipped[k] - start[k]) ** 2).sum()) for k in start))
    assert norm == pytest.approx(1.0, rel=1e-5)
    small = {k: start[k] + 1e-3 for k in start}
    assert all(torch.allclose(clip_update(small, start, 1.0)[k], small[k]) for k in start)  # inside: unchanged


def test_the_gaussian_ledger_is_exact_and_composes_by_the_number_of_shares():
    # a Gaussian's ε(δ) in closed form against dp-accounting's PLD of the same mechanism
    for m, k in ((2.0, 10), (0.8, 3)):
        pld = pld_lib.from_gaussian_mechanism(m, value_discretization_interval=1e-4).self_compose(k)
        assert gaussian_epsilon(math.sqrt(k) / m, 1e-5) == pytest.approx(pld.get_epsilon_for_delta(1e-5), rel=1e-3)
    ledger = PrivacyLedger(1e-5, budget=10.0, neighbouring=SITE_LEVEL)
    for _ in range(4):
        ledger.spend("round", dpa.GaussianDpEvent(1.5), 1)
    assert ledger.epsilon() == pytest.approx(epsilon_of(dpa.GaussianDpEvent(1.5), 4, 1e-5))
    assert PrivacyLedger.from_json(ledger.to_json()).epsilon() == pytest.approx(ledger.epsilon())
    # fewer shares in the sum, less noise, more ε: 3 of 5 planned sites
    full, partial = gs.event(2.0, 5, 5), gs.event(2.0, 3, 5)
    assert partial.noise_multiplier == pytest.approx(full.noise_multiplier * math.sqrt(3 / 5))
    assert epsilon_of(partial, 1, 1e-5) > epsilon_of(full, 1, 1e-5)


def test_a_budget_calibrates_z_and_bad_settings_are_refused():
    z = gs.multiplier_for_budget(8.0, 1e-5, 20)
    assert epsilon_of(gs.event(z, 1, 1), 20, 1e-5) <= 8.0 < epsilon_of(gs.event(z * 0.99, 1, 1), 20, 1e-5)
    ok = dict(algorithm="fedavg", secure_aggregation=True, clip=1.0, dp_epsilon=4.0)
    FedAvgConfig(**ok).validate()
    for bad, says in (({"clip": None}, "--clip"), ({"secure_aggregation": False}, "secure sum"),
                      ({"algorithm": "fedavg-xclp", "dp_epsilon": None, "noise_multiplier": 1.0}, "XCLP"),
                      ({"noise_multiplier": 0.01}, "at least")):
        with pytest.raises(ValueError, match=says):
            FedAvgConfig(**{**ok, **bad}).validate()
    s = FedAvgStrategy(FedAvgConfig(**{**ok, "noise_multiplier": 0.5}).validate(), 10, 4)
    with pytest.raises(ValueError, match="past the budget"):
        s.noise_multiplier  # noqa: B018
    # fedavg-xclp: XCLP's randomized labels take half the budget, the noise on the sums the other half
    x = FedAvgStrategy(FedAvgConfig(**{**ok, "algorithm": "fedavg-xclp"}).validate(), 10, 4)
    assert x.mechanism_epsilon == 2.0 and x.xclp_label_flip > 0
    assert x.noise_multiplier == pytest.approx(gs.multiplier_for_budget(2.0, 1e-5, x.total_rounds()))


def test_rounds_short_of_sites_are_spent_as_they_are_and_a_round_past_the_budget_is_not_decoded():
    # Only the 2 labelled sites of 5 are planned each round: each share is sized for the 2 planned
    # (σ on the sum = zC), so every round costs what was calibrated and the run ends within budget.
    out = run_training({"algorithm": "fedavg", "dataset": "digits", "sites": 5, "labeled_sites": 2, "labels": 200,
                        "rounds": 3, "secure_aggregation": True, "clip": 1.0, "dp_epsilon": 2.0, "quiet": True})
    assert len(out["privacy"]["events"]) == 3 and out["privacy"]["epsilon"] <= 2.0
    # a sum with fewer shares than planned costs more: past the budget it is refused, nothing decoded
    s = FedAvgStrategy(FedAvgConfig(algorithm="fedavg", secure_aggregation=True, clip=1.0, dp_epsilon=2.0,
                                    rounds=2, sites_per_round=4).validate(), 10, 4)
    assert s.release(1, 4, 4) and not s.release(2, 2, 4)
    assert len(s.ledger.events) == 1 and s.ledger.epsilon() <= 2.0
    previous = {"w": torch.zeros(2)}
    assert s.aggregate_masked(np.zeros(2, dtype=np.uint64), 0, previous, t=2, contributed=2, planned=4) is previous


def test_a_dp_fedavg_run_spends_one_gaussian_per_decoded_round():
    out = run_training({"algorithm": "fedavg", "dataset": "digits", "sites": 4, "labels": 400, "rounds": 3,
                        "sites_per_round": 4, "secure_aggregation": True, "clip": 1.0, "dp_epsilon": 30.0,
                        "quiet": True})
    p = out["privacy"]
    assert len(p["events"]) == 3 and p["neighbouring"] == SITE_LEVEL and 0 < p["epsilon"] <= 30.0
    assert out["noise_multiplier"] == pytest.approx(gs.multiplier_for_budget(30.0, 1e-5, 3))
    assert [r["epsilon"] for r in out["history"]] == sorted(r["epsilon"] for r in out["history"])
