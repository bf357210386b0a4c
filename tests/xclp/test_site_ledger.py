"""A site's privacy ledger across jobs and runs (xclp.privacy.site_ledger, SitePolicy.admit)."""

import json
import math
import os
import stat

import numpy as np
import pytest

from xclp.job_params import JobParams
from xclp.privacy import label_dp
from xclp.privacy.ledger import gaussian_epsilon
from xclp.privacy.site_ledger import SiteLedger, TotalExceeded, data_digest, job_releases
from xclp.protocol import SiteSession
from xclp.site_policy import PolicyError, SitePolicy


def predict(job, eps=None, gaussian=False, classes=3):
    p = JobParams(job_id=job, n_classes=classes, crypto="ot", bits=64, k=4)
    if eps is not None:
        flip = label_dp.flip_for_budget(eps, 1e-5, classes) if not gaussian else 0.0
        z = label_dp.multiplier_for_budget(eps, 1e-5) if gaussian else 0.0
        p = JobParams(**{**vars(p), "label_flip": flip, "dp_noise": z})
    return {"kind": "predict", "sites": ["a", "b"], "params": vars(p)}


def train(eps, delta=1e-6, algorithm="fedct"):
    """A training job's status as the coordinator reports it: its algorithm's validated config."""
    from dataclasses import asdict

    from xclp.training.algorithms import STRATEGIES

    opts = {"secure_aggregation": True, "dp_epsilon": eps, "dp_delta": delta, "clip": 1.0, "rounds": 2,
            "sites_per_round": 2}
    cfg = asdict(STRATEGIES[algorithm].config_from_options(algorithm, opts, 2))
    return {"kind": "train", "sites": ["a", "b"], "params": {"algorithm": algorithm, "config": cfg, "classes": 3}}


def test_randomized_labels_of_one_p_are_spent_once(tmp_path):
    led, d = SiteLedger(tmp_path), "f" * 64
    pol = SitePolicy(max_epsilon=3.0)
    first = pol.admit(led, d, "j1", predict("j1", 2.0))
    assert first["new"] and first["epsilon"] == pytest.approx(2.0, rel=1e-3)
    again = pol.admit(led, d, "j2", predict("j2", 2.0))  # another job, same p: the same labels, nothing new
    assert again["new"] and again["epsilon"] == pytest.approx(first["epsilon"])
    # another p is another randomization: it composes, here past the total
    with pytest.raises(PolicyError, match=r"policy: .*total would reach ε = 3\.\d+.*past its maximum of 3"):
        pol.admit(led, d, "j3", predict("j3", 1.5))
    assert len(led.read()["files"][d]["jobs"]) == 2


def test_gaussian_jobs_compose_and_refuse_past_the_total(tmp_path):
    led, d = SiteLedger(tmp_path), data_digest(np.zeros((3, 2)), np.array([0, 1, -1]))
    pol = SitePolicy(max_epsilon=2.0)  # two Gaussian jobs at 1.5 compose to 2.21
    one = pol.admit(led, d, "g1", predict("g1", 1.5, gaussian=True))["epsilon"]
    assert one == pytest.approx(1.5, rel=1e-3)
    z = JobParams(**predict("g1", 1.5, gaussian=True)["params"]).dp_noise
    with pytest.raises(PolicyError) as err:
        pol.admit(led, d, "g2", predict("g2", 1.5, gaussian=True))
    two = gaussian_epsilon(math.sqrt(4) / z, 1e-5)  # four Gaussians of σ/Δ = z
    assert f"{two:.4g}" in str(err.value)
    assert SitePolicy(max_epsilon=3.0).admit(led, d, "g2", predict("g2", 1.5, gaussian=True))["epsilon"] == \
        pytest.approx(two, rel=1e-6)


def test_once_per_job_id_and_persisted(tmp_path):
    d = "a" * 64
    pol = SitePolicy(max_epsilon=4.0)
    st = predict("g1", 2.0, gaussian=True)
    assert pol.admit(SiteLedger(tmp_path), d, "g1", st)["new"]
    again = pol.admit(SiteLedger(tmp_path), d, "g1", st)  # a restarted agent: a new ledger object on the file
    assert not again["new"] and again["epsilon"] == pytest.approx(2.0, rel=1e-3)
    # the same id with other parameters is another job
    assert pol.admit(SiteLedger(tmp_path), d, "g1", predict("g1", 1.0, gaussian=True))["new"]
    path = tmp_path / "privacy-ledger.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(json.loads(path.read_text())["files"][d]["jobs"]) == 2
    assert SiteLedger(tmp_path).epsilon(d) > 2.0 and SiteLedger(tmp_path).epsilon("b" * 64) == 0.0


def test_data_files_are_apart_and_unbounded_jobs_end_the_budget(tmp_path):
    led = SiteLedger(tmp_path)
    SitePolicy().admit(led, "a" * 64, "plain", predict("plain"))  # no DP: recorded, nothing bounded
    assert led.epsilon("a" * 64) == math.inf
    text = (tmp_path / "privacy-ledger.json").read_text()
    assert "Infinity" not in text  # strict JSON: unbounded is null
    (e,) = json.loads(text)["files"]["a" * 64]["jobs"].values()
    assert e["epsilon_after"] is None
    assert SitePolicy().admit(led, "a" * 64, "plain", predict("plain"))["epsilon"] == math.inf  # once
    with pytest.raises(PolicyError, match="total would reach ε = inf"):
        SitePolicy(max_epsilon=8.0).admit(led, "a" * 64, "j", predict("j", 1.0))
    assert SitePolicy(max_epsilon=8.0).admit(led, "b" * 64, "j", predict("j", 1.0))["new"]  # other data


def test_training_jobs_count_by_their_stated_budget(tmp_path):
    led, d = SiteLedger(tmp_path, delta=1e-5), "c" * 64
    assert job_releases(train(2.0)) == [{"mechanism": "epsilon_delta", "epsilon": 2.0, "delta": 1e-6}]
    assert job_releases(predict("x", 1.0), covered=True) == []  # a round the site checked: inside its training job
    assert job_releases({**predict("x", 1.0), "parent": "t"}) != []  # a "parent" is only the coordinator's word
    pol = SitePolicy(max_epsilon=5.0)
    assert pol.admit(led, d, "t1", train(2.0))["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert pol.admit(led, d, "t2", train(2.0))["epsilon"] == pytest.approx(4.0, rel=1e-2)
    with pytest.raises(PolicyError):
        pol.admit(led, d, "t3", train(2.0))
    # δ adds up: two jobs at the site's own δ cannot be stated together at that δ
    strict = SiteLedger(tmp_path / "x", delta=1e-5)
    assert strict.admit(d, "k1", "k1", job_releases(train(1.0, 1e-5)), 100.0)["epsilon"] == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(TotalExceeded, match="ε = inf"):
        strict.admit(d, "k2", "k2", job_releases(train(1.0, 1e-5)), 100.0)
    # ... but DP-FedAvg's are Gaussians: two at ε = 1 compose in μ, at the site's own δ
    (g,) = job_releases(train(1.0, 1e-5, "fedavg"))
    assert g["mechanism"] == "gaussian" and gaussian_epsilon(1 / g["noise_multiplier"], 1e-5) == pytest.approx(1.0)
    gl = SiteLedger(tmp_path / "g", delta=1e-5)
    for k in ("f1", "f2"):
        got = gl.admit(d, k, k, job_releases(train(1.0, 1e-5, "fedavg")), 100.0)["epsilon"]
    assert got == pytest.approx(gaussian_epsilon(math.sqrt(2) / g["noise_multiplier"], 1e-5)) and 1.0 < got < 2.0


def test_one_label_secret_per_file_gives_the_same_randomized_labels(tmp_path):
    led = SiteLedger(tmp_path)
    rng = np.random.default_rng(0)
    # 400 points (266 labelled): the site's label secret is a fresh CSPRNG draw each run, so "the released
    # labels differ from the true ones" (and from a fresh draw's) may fail only with probability ≈ 0.8^266
    # (with 26 labels it was ≈ 0.8^26 ≈ 0.3 %: it failed once in a full suite run)
    X, y = rng.normal(size=(400, 3)), rng.integers(0, 3, 400)
    y[::3] = -1
    d = data_digest(X, y)
    assert d == data_digest(X.copy(), y.copy()) and d != data_digest(X, np.where(y == 0, 1, y))
    s1 = led.label_seed(d, 0.3, 3)
    assert SiteLedger(tmp_path).label_seed(d, 0.3, 3) == s1  # kept in the file
    assert led.label_seed(d, 0.4, 3) != s1 and led.label_seed(d, 0.3, 4) != s1
    released = []
    for job in ("j1", "j2"):
        p = JobParams(job_id=job, n_classes=3, crypto="ot", bits=64, k=4, label_flip=0.3)
        released.append(SiteSession(p, "a", X, y, noise_seed=os.urandom(32), label_seed=s1).y_released)
    assert np.array_equal(released[0], released[1])  # two jobs, fresh per-job secrets: the same labels
    assert not np.array_equal(released[0][y >= 0], y[y >= 0])
    other = SiteSession(JobParams(job_id="j3", n_classes=3, crypto="ot", bits=64, k=4, label_flip=0.3), "a", X, y,
                        noise_seed=os.urandom(32)).y_released  # without the site's seed: a fresh draw
    assert not np.array_equal(other, released[0])


def test_a_job_without_dp_is_recorded_without_loading_the_accountant(tmp_path):
    # A job that releases without DP is unbounded: ten agents opening it on a shared host must not each
    # load dp_accounting (and scipy.signal with it, ~2 s of CPU apiece) to learn that ε is infinite.
    import subprocess
    import sys

    code = ("import sys; from xclp.site_policy import SitePolicy; from xclp.privacy.site_ledger import SiteLedger\n"
            "from xclp.job_params import JobParams\n"
            "st = {'kind': 'predict', 'sites': ['a', 'b'], 'params': vars(JobParams(job_id='j1', n_classes=3, "
            "crypto='plaintext', bits=64, k=4))}\n"
            f"led = SiteLedger({str(tmp_path)!r})\n"
            "for j in ('j1', 'j2'): got = SitePolicy(allow_plaintext=True).admit(led, 'f' * 64, j, {**st, 'params': "
            "{**st['params'], 'job_id': j}})\n"
            "print(got['epsilon'], got['jobs'], 'dp_accounting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["inf", "2", "False"]
