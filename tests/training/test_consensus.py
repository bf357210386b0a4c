"""FedCT's consensus vote, the public set's pinning and the label byte counts."""

import numpy as np
import pytest

from xclp.training.fedct import PublicSet, consensus, label_bytes, vote_counts


def test_plain_majority():
    votes = np.array([[2, 0, 1], [2, 1, 1], [1, 1, 0]])  # 3 sites × 3 points
    assert consensus(votes, 3).tolist() == [2, 1, 1]


@pytest.mark.parametrize("tie, expected", [("lowest", [0, 1, 0]), ("abstain", [-1, -1, 0])])
def test_ties_lowest_and_abstain(tie, expected):
    votes = np.array([[0, 3, 0], [2, 1, 0]])  # points 0 and 1 tied 1:1, point 2 unanimous
    assert consensus(votes, 4, tie=tie).tolist() == expected


def test_tie_random_is_seeded_and_stays_among_the_tied():
    votes = np.array([[1] * 200, [3] * 200, [0] * 100 + [1] * 100])  # first 100 tied {0,1,3}; last 100 → 1
    a = consensus(votes, 4, tie="random", rng=np.random.default_rng(7))
    b = consensus(votes, 4, tie="random", rng=np.random.default_rng(7))
    assert np.array_equal(a, b)
    assert set(a[:100].tolist()) == {0, 1, 3}  # every tied class wins sometimes, class 2 never
    assert np.all(a[100:] == 1)


def test_quorum_keeps_only_qualified_majorities():
    votes = np.zeros((10, 3), dtype=np.int64)
    votes[0, 1] = 1  # point 1: 9 of 10
    votes[:2, 2] = 1  # point 2: 8 of 10
    assert consensus(votes, 2, quorum=0.9).tolist() == [0, 0, -1]
    assert consensus(votes, 2, quorum=0.8).tolist() == [0, 0, 0]


def test_abstentions_are_not_votes():
    votes = np.array([[-1, -1, 2], [-1, 1, -1], [-1, 0, -1]])
    # point 0: nobody voted → no label; point 1: tie 0:1 → lowest; point 2: the only vote cast wins
    assert consensus(votes, 3).tolist() == [-1, 0, 2]
    # the quorum counts the votes cast: 1 of 1 meets 0.9
    assert consensus(votes, 3, quorum=0.9).tolist() == [-1, -1, 2]


def test_a_class_one_site_never_saw():
    """Learners that never saw a class cannot vote for it; the others still can make it win."""
    from xclp.training.models import make_learner

    rng = np.random.default_rng(0)
    centres = np.array([[0, 0], [5, 0], [0, 5]], dtype=float)
    X = np.concatenate([c + rng.normal(size=(20, 2)) * 0.3 for c in centres])
    y = np.repeat([0, 1, 2], 20)
    U = centres + 0.01
    no_two = make_learner("tree", 2, 3, seed=0).fit(X[y < 2], y[y < 2])
    full = [make_learner("logreg", 2, 3).fit(X, y), make_learner("tree", 2, 3, seed=1).fit(X, y)]
    votes = np.stack([m.predict(U) for m in [no_two, *full]])
    assert 2 not in votes[0]
    assert consensus(votes, 3).tolist() == [0, 1, 2]
    assert vote_counts(votes, 3).shape == (3, 3)


def test_votes_out_of_range_are_refused():
    with pytest.raises(ValueError, match="class indices"):
        consensus(np.array([[0, 3]]), 3)
    with pytest.raises(ValueError, match="tie"):
        consensus(np.array([[0]]), 3, tie="highest")
    with pytest.raises(ValueError, match="quorum"):
        consensus(np.array([[0]]), 3, quorum=1.5)


def test_public_set_is_pinned_by_content_and_order():
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    pub = PublicSet.create(X)
    pub.verify(pub.digest)
    with pytest.raises(ValueError, match="forged"):
        PublicSet(X[::-1].copy(), pub.digest).verify(pub.digest)
    changed = X.copy()
    changed[2, 1] += 1e-9
    with pytest.raises(ValueError, match="forged"):
        PublicSet(changed, pub.digest).verify(pub.digest)


def test_label_bytes():
    assert label_bytes(1000, 10) == 500  # 4 bits a label
    assert label_bytes(1000, 10, bitpack=False) == 1000
    assert label_bytes(1000, 2) == 125
    assert label_bytes(3, 11) == 2
