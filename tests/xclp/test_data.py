import numpy as np
import pytest

from xclp.data import DataError, load_arrays, make_dataset
from xclp.datafile import dataset_from_file as dataset_from_npz
from xclp.splits import assign_sites, hide_labels, leave_one_site_out, parse_split, simulate_sites


def _ok(n=20, d=3):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    y = np.tile([0, 1], n // 2)
    y[::3] = -1
    site = np.array(["a", "b"] * (n // 2))
    return X, y, site


def test_valid_dataset_roundtrip(tmp_path):
    X, y, site = _ok()
    np.savez(tmp_path / "d.npz", X=X, y=y, site=site, y_true=np.tile([0, 1], 10))
    ds = dataset_from_npz(tmp_path / "d.npz")
    assert ds.n == 20 and ds.n_classes == 2 and ds.sites == ["a", "b"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda X, y, s: (X[:, 0], y, s), "2-D"),
        (lambda X, y, s: (np.where(np.arange(X.size).reshape(X.shape) == 4, np.nan, X), y, s), "NaN"),
        (lambda X, y, s: (np.where(np.arange(X.size).reshape(X.shape) == 4, np.inf, X), y, s), "infinite"),
        (lambda X, y, s: (X, y[:-1], s), "one entry per point"),
        (lambda X, y, s: (X, np.where(np.arange(y.size) == 1, -5, y), s), "label -5"),
        (lambda X, y, s: (X, y + 0.5, s), "integer class labels"),
        (lambda X, y, s: (X, y, s[:-2]), "site must be"),
        (lambda X, y, s: (X, y, np.where(np.arange(s.size) == 0, " ", s)), "empty names"),
        (lambda X, y, s: (X, np.full_like(y, -1), s), "no point is labelled"),
        (lambda X, y, s: (X, np.where(y >= 0, 0, -1), s), "at least 2 classes"),
        (lambda X, y, s: (X[:0], y[:0], s[:0]), "empty"),
        (lambda X, y, s: (X.astype(str), y, s), "real numbers"),
    ],
)
def test_validation_errors(mutate, message):
    X, y, site = _ok()
    with pytest.raises(DataError, match=message.replace("-5", "−?-?5") if "-5" in message else message):
        make_dataset(*mutate(X, y, site))


def test_y_true_must_agree_and_range():
    X, y, site = _ok()
    yt = np.tile([0, 1], 10)
    bad = yt.copy()
    bad[1] = 0 if y[1] == 1 else 1
    with pytest.raises(DataError, match="disagree"):
        make_dataset(X, y, site, y_true=bad)
    with pytest.raises(DataError, match="out of range"):
        make_dataset(X, np.where(y == 1, 5, y), site, n_classes=3)


def test_npz_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        dataset_from_npz(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable"):
        dataset_from_npz(tmp_path / "junk.npz")
    np.savez(tmp_path / "nosite.npz", X=np.ones((3, 2)), y=np.array([0, 1, -1]))
    with pytest.raises(DataError, match="missing array"):
        dataset_from_npz(tmp_path / "nosite.npz")


def test_unknown_dataset_and_limit():
    with pytest.raises(DataError, match="unknown data set"):
        load_arrays("cifar")
    X, y = load_arrays("digits", limit=100, seed=3)
    X2, y2 = load_arrays("digits", limit=100, seed=3)
    assert X.shape == (100, 64) and np.array_equal(y, y2) and np.array_equal(X, X2)
    assert load_arrays("digits", limit=1797)[0].shape == (1797, 64)  # all of it: allowed
    with pytest.raises(DataError, match="more than the 1,797 points of 'digits'"):
        load_arrays("digits", limit=1798)


def test_fashion_mnist_missing_says_how_to_install(monkeypatch, tmp_path):
    import xclp.data as data

    monkeypatch.setattr(data, "FASHION_MNIST_DIR", tmp_path)
    with pytest.raises(DataError, match="apt-get install -y dataset-fashion-mnist"):
        data.load_fashion_mnist_arrays()


def test_mnist5k_loads():
    X, y = load_arrays("mnist5k")
    assert X.shape == (5000, 784) and set(np.unique(y)) == set(range(10)) and 0 <= X.min() and X.max() <= 1


def test_split_parsing():
    assert parse_split("iid") == ("iid", None)
    assert parse_split("dirichlet:0.5") == ("dirichlet", 0.5)
    for bad in ("dirichlet:0", "dirichlet:x", "zipf"):
        with pytest.raises(DataError):
            parse_split(bad)


def test_iid_split_is_balanced_and_dirichlet_is_skewed(digits):
    X, y = digits
    rng = np.random.default_rng(0)
    iid = assign_sites(y, 5, "iid", rng)
    assert np.bincount(iid).max() - np.bincount(iid).min() <= 1
    skew = assign_sites(y, 5, "dirichlet:0.1", np.random.default_rng(0))
    near = assign_sites(y, 5, "dirichlet:1000", np.random.default_rng(0))

    def spread(a):  # mean total-variation distance of site label histograms from the global one
        g = np.bincount(y, minlength=10) / y.size
        return np.mean([0.5 * np.abs(np.bincount(y[a == s], minlength=10) / (a == s).sum() - g).sum()
                        for s in range(5)])

    assert spread(skew) > 0.3 > 0.05 > spread(near)
    assert np.bincount(skew, minlength=5).min() >= 1


def test_labelled_fraction_and_unlabelled_sites(digits):
    X, y = digits
    ds = simulate_sites(X, y, 4, "iid", 0.2, seed=1, unlabelled_sites=(3,))
    for s in ds.sites[:3]:
        m = ds.site == s
        assert abs((ds.y[m] >= 0).mean() - 0.2) < 0.01
    assert (ds.y[ds.site == "site3"] < 0).all()
    assert np.array_equal(ds.y_true, y)
    with pytest.raises(DataError):
        hide_labels(y, np.zeros_like(y), 1.5, np.random.default_rng(0))


def test_leave_one_site_out(digits):
    X, y = digits
    ds = simulate_sites(X, y, 3, "iid", 0.3, seed=1)
    out = leave_one_site_out(ds, "site1")
    assert (out.y[out.site == "site1"] < 0).all() and (out.y[out.site == "site0"] >= 0).any()
    with pytest.raises(DataError, match="unknown site"):
        leave_one_site_out(ds, "nowhere")


def test_too_many_sites():
    with pytest.raises(DataError, match="at least"):
        assign_sites(np.zeros(3, dtype=int), 5)
