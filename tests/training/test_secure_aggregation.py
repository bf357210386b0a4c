"""Secure aggregation of FedAvg updates: the masked parts sum to exactly the fixed-point total that the
simulation averages, each part alone looks nothing like the weights, and a restart uses fresh masks."""

import numpy as np
import pytest
import torch
from training_helpers import masked_federation

from crypto.errors import ProtocolError
from crypto.secure_sum import server_sum
from xclp.training import secure_aggregation as secagg
from xclp.training.fedavg import aggregate, average_states

SITES = ["a", "b", "c"]


@pytest.fixture
def setup():
    return masked_federation(SITES)


def masked(setup, me, participants, attempt=0, t=1, state=...):
    template, states, keys = setup
    return secagg.masked_update(states[me] if state is ... else state, template, me=me, private=keys[me],
                                public_keys={s: k.public_bytes() for s, k in keys.items()},
                                participants=participants, job="j", t=t, attempt=attempt)


def test_masked_sum_equals_the_simulations_mean_bit_for_bit(setup):
    template, states, _ = setup
    total = server_sum([masked(setup, s, SITES) for s in SITES])
    got = secagg.mean_from_total(total, 3, template)
    want = aggregate([(states[s], 1) for s in SITES], secure=True)  # what the simulation computes
    assert all(torch.equal(got[k], want[k]) for k in want)
    plain = average_states([states[s] for s in SITES])
    assert all(torch.allclose(got[k], plain[k], atol=1e-6) for k in plain)  # and it is the mean


def test_a_single_masked_update_reveals_nothing_and_masks_are_fresh(setup):
    template, states, _ = setup
    part = masked(setup, "a", SITES)
    plain = secagg.encode_update(states["a"], template)
    assert np.mean(part == plain) < 0.01  # every value is covered by a mask
    assert np.mean(part == masked(setup, "a", SITES, attempt=1)) < 0.01  # a restart masks anew
    assert np.mean(part == masked(setup, "a", SITES, t=2)) < 0.01  # and so does the next round
    # a part from the wrong attempt does not cancel: the sum is refused, not averaged into a random model
    total = server_sum([masked(setup, "a", SITES, attempt=1), masked(setup, "b", SITES), masked(setup, "c", SITES)])
    with pytest.raises(ProtocolError, match="did not cancel"):
        secagg.mean_from_total(total, 3, template)


def test_a_restart_without_a_site_sums_the_others_and_a_site_without_labels_adds_zeros(setup):
    template, states, _ = setup
    total = server_sum([masked(setup, "a", ["a", "c"], attempt=1), masked(setup, "c", ["a", "c"], attempt=1)])
    want = aggregate([(states["a"], 1), (states["c"], 1)], secure=True)
    got = secagg.mean_from_total(total, 2, template)
    assert all(torch.equal(got[k], want[k]) for k in want)
    total = server_sum([masked(setup, "a", SITES), masked(setup, "b", SITES, state=None), masked(setup, "c", SITES)])
    got = secagg.mean_from_total(total, 2, template)  # b trained nothing (n = 0): the mean is over a and c
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_diverged_or_misshapen_weights_are_refused(setup):
    template, states, _ = setup
    big = {k: v * 0 + 1e6 for k, v in template.items()}
    with pytest.raises(ProtocolError, match="diverged"):
        secagg.encode_update(big, template)
    nan = {k: v * float("nan") for k, v in template.items()}
    with pytest.raises(ProtocolError, match="diverged"):
        secagg.encode_update(nan, template)
    with pytest.raises(ProtocolError, match="does not fit"):
        secagg.encode_update({"x": torch.zeros(3)}, template)
    with pytest.raises(ProtocolError, match="cannot average"):
        secagg.mean_from_total(np.zeros(secagg.n_values(template), np.uint64), 0, template)


def test_simulation_with_secure_aggregation_arithmetic_matches_the_float_mean():
    from xclp.training.runner import TrainConfig, run_training

    kw = dict(algorithm="fedavg", dataset="digits", sites=3, labels=30, rounds=2, local_epochs=1, seed=0, quiet=True)
    plain, secure = (run_training(TrainConfig(secure_aggregation=s, **kw)) for s in (False, True))
    assert secure["config"]["secure_aggregation"] is True
    assert abs(plain["final_accuracy"] - secure["final_accuracy"]) <= 0.01  # 2^-32 per weight: no visible change
