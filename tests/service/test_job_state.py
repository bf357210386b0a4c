"""A training job's state is typed: every write is validated, so a misspelt field or a wrong type is
an error at once instead of a new key that no step reads."""

import pydantic
import pytest

from service.db import Job


def test_training_state_writes_are_checked_and_reads_are_typed():
    job = Job(id="j", kind="train", params={}, sites=["a", "b"], live=["a", "b"], state={})
    assert job.training.history == [] and job.training.final is None  # defaults before the first step
    job.update_training(participants=["a", "b"], strikes={"a": 1})
    before = job.state
    job.update_training(history=[{"round": 1}])
    assert job.state is not before  # a new dict: SQLAlchemy sees the change
    assert job.training.participants == ["a", "b"] and job.training.history == [{"round": 1}]
    with pytest.raises(pydantic.ValidationError):
        job.update_training(participant=["a"])  # misspelt
    with pytest.raises(pydantic.ValidationError):
        job.update_training(strikes={"a": "many"})
    assert job.training.strikes == {"a": 1}  # a refused write changes nothing


def test_a_rounds_predict_job_says_what_it_propagates_over():
    child = Job(id="c", kind="predict", params={}, sites=["a"], live=["a"], parent="j",
                state={"features": "embedding", "model_round": 3})
    assert child.round_xclp.features == "embedding" and child.round_xclp.model_round == 3
    assert Job(id="p", kind="predict", params={}, sites=["a"], live=["a"], state={}).round_xclp is None
    bad = Job(id="c2", kind="predict", params={}, sites=["a"], live=["a"], parent="j",
              state={"features": "pixels", "model_round": 3})
    with pytest.raises(pydantic.ValidationError):
        _ = bad.round_xclp
