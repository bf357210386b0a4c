"""The registry of job kinds (xclp.job_kinds) and a training run's topic rules (xclp.training_topics):
what the drivers read instead of writing their own phase lists and topic parsing."""

from __future__ import annotations

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
