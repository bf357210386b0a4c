"""Label-DP of XCLP's sums (xclp/privacy/label_dp.py): randomized labels and Gaussian noise shares."""

import dataclasses
import json
import math

import numpy as np
import pytest

import xclp.protocol as protocol
from cli.main import main
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.privacy import label_dp
from xclp.privacy import randomized_response as rr
from xclp.privacy.ledger import gaussian_epsilon
from xclp.protocol import SiteSession
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import simulate_sites


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", 600, 0)
    return simulate_sites(X, y, 4, "iid", 0.2, 0, (), n_classes=10)


def params(**kw):
    return JobParams(job_id="dp", n_classes=10, bits=256, **kw)


def capture_scores(monkeypatch):
    """The score rows Z each site unmasks, by site (the site's own view)."""
    seen = {}
    real = protocol.predict_from_scores

    def spy(Z, y_known=None):
        seen[len(seen)] = np.array(Z)
        return real(Z, y_known)

    monkeypatch.setattr(protocol, "predict_from_scores", spy)
    return seen


def test_noise_shares_cancel_nothing_but_the_masks(ds):
    # The same noise keys with a secure protocol and with the plaintext reference: the masks cancel,
    # the noise does not, and the two runs agree to the last bit of the fixed-point sum.
    p = params(dp_noise=0.5, label_flip=0.3)
    plain = run_xclp(ds, p, seed=3)
    secure = run_xclp(ds, dataclasses.replace(p, crypto="ot"), seed=3)
    np.testing.assert_array_equal(secure.labels, plain.labels)
    np.testing.assert_array_equal(secure.confidence, plain.confidence)
    exact = run_xclp(ds, params(), seed=3)
    assert not np.array_equal(exact.labels, plain.labels)  # the noise changed something


def test_each_site_receives_gaussian_noise_of_the_stated_sigma(ds, monkeypatch):
    # Unbalanced sums, no column clipped (C far above every column norm): what a site unmasks differs
    # from the noiseless run by the other participants' shares only, N(0, (z·C·√2)²) per entry.
    z, C = 1.0, 500.0
    seen = capture_scores(monkeypatch)
    run_xclp(ds, params(dp_noise=z, dp_clip=C, balanced=False), seed=1)
    noisy = dict(seen)
    seen.clear()
    monkeypatch.setattr(label_dp, "noise", lambda shape, std, key, frac_bits: np.zeros(shape, dtype=np.int64))
    run_xclp(ds, params(dp_noise=z, dp_clip=C, balanced=False), seed=1)
    diff = np.concatenate([(noisy[i] - seen[i]).ravel() for i in noisy])
    sigma = z * C * math.sqrt(2)
    assert abs(diff.mean()) < 4 * sigma / math.sqrt(diff.size)
    assert diff.std() == pytest.approx(sigma, rel=0.05)


def test_a_column_is_clipped_over_the_other_sites_rows_only():
    cols = np.array([[3.0, 0.1], [4.0, 0.1], [100.0, 100.0]])  # row 2: the site's own row
    out = label_dp.clip_columns(cols, np.array([0, 1]), 1.0)
    np.testing.assert_allclose(np.linalg.norm(out[:2], axis=0), [1.0, np.hypot(0.1, 0.1)])
    np.testing.assert_allclose(out[2], [20.0, 100.0])  # the whole column scaled by the same factor


def test_randomized_labels_flip_at_the_stated_rate_and_are_drawn_once_per_secret():
    y = np.repeat(np.arange(10), 2000)
    key = label_dp.respond_key(b"s" * 32)
    a = label_dp.respond(y, 0.4, 10, key)
    assert np.mean(a != y) == pytest.approx(0.4 * 0.9, abs=0.015)  # a flip lands on the same label 1/k of the time
    counts = np.bincount(a[a != y], minlength=10)
    assert counts.min() > 0.8 * counts.mean()  # the replacements are uniform
    np.testing.assert_array_equal(label_dp.respond(y, 0.4, 10, label_dp.respond_key(b"s" * 32)), a)
    assert not np.array_equal(label_dp.respond(y, 0.4, 10, None), a)  # no secret: a fresh draw


def test_sessions_of_one_run_share_their_randomized_labels_and_keep_their_own(ds):
    X, y = ds.X[:50], np.where(np.arange(50) % 2 == 0, np.arange(50) % 10, -1)
    p = params(label_flip=0.5)
    one = SiteSession(dataclasses.replace(p, job_id="round1"), "a", X, y, noise_seed=b"k" * 32)
    two = SiteSession(dataclasses.replace(p, job_id="round2"), "a", X, y, noise_seed=b"k" * 32)
    np.testing.assert_array_equal(one.y_released, two.y_released)
    assert np.any(one.y_released != y)
    np.testing.assert_array_equal(one.y, y)  # the true labels stay for the site's own result
    np.testing.assert_array_equal(one.y_released < 0, y < 0)  # unlabelled points stay unlabelled


def test_budgets_calibrate_the_noise_and_the_ledger_states_them():
    for eps in (0.5, 2.0, 8.0):
        p = label_dp.flip_for_budget(eps, 1e-5, 10)
        assert rr.epsilon_one(p, 10) <= eps * (1 + 1e-6)
        assert rr.epsilon_one(p * 1.01, 10) < eps  # the least noise that meets it (up to the search's step)
        z = label_dp.multiplier_for_budget(eps, 1e-5, jobs=3)
        assert label_dp.epsilon(z, 3, 1e-5) <= eps
        assert gaussian_epsilon(math.sqrt(6) / (0.99 * z), 1e-5) > eps  # 1 % less noise breaks it
    record = params(label_flip=label_dp.flip_for_budget(2.0, 1e-5, 10)).privacy()
    assert record["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert record["neighbouring"] == label_dp.LABEL_LEVEL
    assert [e["what"] for e in record["events"]] == ["xclp: randomized labels"]
    both = params(label_flip=0.5, dp_noise=2.0).privacy(jobs=2)
    assert [(e["what"], e["count"]) for e in both["events"]] == [
        ("xclp: randomized labels", 1), ("xclp: label counts", 2), ("xclp: row sums", 2)]
    assert params().privacy()["epsilon"] is None


@pytest.mark.parametrize("bad", [dict(dp_noise=-1.0), dict(dp_noise=float("nan")), dict(dp_noise=0.01),
                                 dict(dp_clip=0.0), dict(label_flip=1.0), dict(label_flip=-0.1),
                                 dict(dp_delta=0.0)])
def test_bad_label_dp_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        params(**bad).validate()


def test_more_budget_buys_accuracy(ds):
    acc = {}
    for eps in (0.5, 8.0):
        p = params(label_flip=label_dp.flip_for_budget(eps, 1e-5, 10))
        acc[eps] = unlabelled_accuracy(ds, run_xclp(ds, p, seed=0).labels)
    exact = unlabelled_accuracy(ds, run_xclp(ds, params(), seed=0).labels)
    assert acc[8.0] > acc[0.5] + 0.3
    assert acc[8.0] > exact - 0.05


def test_simulate_predict_reports_the_ledger_and_refuses_two_noise_settings(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "predict", "--dataset", "digits", "--limit", "300", "--quiet", "--no-baselines",
                 "--bits", "128", "--dp-epsilon", "3", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["privacy"]["epsilon"] <= 3 * (1 + 1e-6) and r["label_dp"]["label_flip"] > 0
    assert main(["simulate", "predict", "--dataset", "digits", "--limit", "300", "--quiet", "--dp-epsilon", "3",
                 "--dp-noise", "1"]) == 2
    assert "not both" in capsys.readouterr().err
