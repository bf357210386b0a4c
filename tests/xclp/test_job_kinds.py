"""The registry of job kinds (xclp.job_kinds) and a training run's topic rules (xclp.training_topics):
what the drivers read instead of writing their own phase lists and topic parsing."""

from __future__ import annotations

import numpy as np
import pytest

from xclp.job_kinds import job_kind
from xclp.training_topics import max_body, obsolete


def test_each_kind_names_its_phases_and_the_phase_of_each_topic():
    train, predict = job_kind("train"), job_kind("predict")
    assert train.steps == ("setup", "round", "evaluate") and train.phases[-1] == predict.phases[-1] == "done"
    assert [train.topic_phase(t) for t in ("hello", "keys", "model/0", "plan/1", "update/1/0", "model/1", "eval")] \
        == ["setup", "setup", "setup", "round", "round", "round", "evaluate"]
    assert predict.topic_phase("pair/a/b") == "hamming" and predict.topic_phase("sums") == "row_sums"
    with pytest.raises(ValueError, match="unknown job kind 'fit'"):
        job_kind("fit")


def test_a_closed_round_leaves_its_updates_and_the_models_before_the_last_two_to_be_pruned():
    done = 3
    assert [t for t in ("update/3", "update/3/1", "update/4", "model/1", "model/2", "model/3", "votes/1",
                        "consensus/1", "hello", "model/x") if obsolete(t, done)] == ["update/3", "update/3/1", "model/1"]
    assert max_body("hello") == max_body("eval") == 1 << 26 and max_body("update/1") is None


class _Announces:
    """A mailbox holding only the sites' announces (all a prediction job's size limits read)."""

    def __init__(self, sizes: dict[str, int]):
        from xclp.announce import encode_announce

        self.bodies = {s: encode_announce(s, b"k" * 32, n, np.zeros(0, np.int64), b"c" * 32, features=4)
                       for s, n in sizes.items()}

    def body(self, sender, recipient, topic):
        assert (recipient, topic) == ("coordinator", "announce")
        return self.bodies[sender]

    def bodies_from(self, senders, recipient, topic):
        return {s: self.body(s, recipient, topic) for s in senders}


def test_a_prediction_jobs_limits_opaque_bodies_and_pruning_come_from_its_kind():
    from xclp.job_params import JobParams
    from xclp.prediction_job import PredictState
    from xclp.prediction_topics import SLACK

    predict, train = job_kind("predict"), job_kind("train")
    params = JobParams(job_id="j", n_classes=3, k=5, bits=64, blocking_tables=4)
    state = PredictState(sites=["a", "b"], live=["a", "b"], phase="row_sums", graph_sites=["a", "b"])
    mail = _Announces({"a": 10, "b": 30})
    limit = {t: predict.max_body(t, "a", params, state, mail) for t in
             ("seed", "announce", "intra", "rows/0", "tags", "knn", "codes", "pair/a/b/0", "share/a/b")}
    assert limit == {"seed": 1 << 12, "announce": 1 << 26, "intra": SLACK + 10 * (8 << 16),
                     "rows/0": SLACK + 8 * 40 * 3, "tags": SLACK + 10 * 8 * 4, "knn": SLACK + 10 * 10 * 5,
                     "codes": SLACK + 10 * 8, "pair/a/b/0": None, "share/a/b": None}
    assert predict.max_body("counts/0", "a", params, state, mail) > SLACK
    assert [t for t in ("pair/a/b/0", "share/a/b", "bpair/1/a/b/0", "bshare/1/a/b", "rows/0", "intra")
            if predict.opaque(t)] == ["pair/a/b/0", "share/a/b", "bpair/1/a/b/0", "bshare/1/a/b"]
    assert not any(train.opaque(t) for t in ("update/1", "model/1", "hello"))
    topics = ("pair/a/b/0", "bpair/1/a/b/0", "share/a/b", "rows/0", "announce")
    assert not predict.prunes(state) and not any(predict.obsolete(t, state) for t in topics)
    state.status = "done"
    assert predict.prunes(state) and [t for t in topics if predict.obsolete(t, state)] == ["pair/a/b/0", "bpair/1/a/b/0"]


def test_what_differs_between_the_kinds_is_a_trait_a_driver_asks():
    """The drivers ask these instead of comparing a job's kind with a name (tests/test_layers.py)."""
    from xclp.mail import Inadmissible
    from xclp.prediction_job import PredictState

    train, predict = job_kind("train"), job_kind("predict")
    assert train.rounds and train.admits_with_body
    assert not predict.rounds and not predict.admits_with_body
    params = predict.params({"job_id": "j", "n_classes": 2})
    assert params.k == 10 and train.params({"algorithm": "fedavg"}) is None
    assert predict.privacy({"job_id": "j", "n_classes": 2}) == params.privacy() and train.privacy({}) == {}
    state = PredictState.new(["a", "b"])
    predict.admit(params, state, None, "a", "coordinator", "announce")  # setup: an announce is the order's next
    with pytest.raises(Inadmissible):
        predict.admit(params, state, None, "a", "coordinator", "rows/0")  # not in setup
    train.admit(None, None, None, "a", "coordinator", "anything")  # admitted with its body, by the machine
