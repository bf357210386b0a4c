"""A blocked graph's round-0 uploads are checked for their form at upload (a bad one is a 422 there, not
a site dropped later by the engine)."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from xclp.job_params import JobParams
from xclp.prediction_topics import _check_blocked_input
from xclp.wire import dump_array, dump_bundle

P = JobParams(job_id="j", n_classes=3, bits=64, k=4, graph="blocked", blocking_tables=8)


def test_good_round_0_uploads_pass():
    _check_blocked_input("tags", dump_array(np.zeros((5, 8), np.uint64)), 5, P)
    _check_blocked_input("codes", bytes(5 * 8), 5, P)
    _check_blocked_input("knn", dump_bundle({"idx": np.full((5, 4), -1, np.int64), "dist": np.zeros((5, 4), np.uint16)}),
                         5, P)


@pytest.mark.parametrize("kind,body", [
    ("tags", dump_array(np.zeros((5, 7), np.uint64))),  # a table short
    ("tags", dump_array(np.zeros((5, 8), np.int64))),  # not uint64
    ("codes", bytes(5 * 8 + 1)),
    ("knn", dump_bundle({"idx": np.full((5, 5), -1, np.int64), "dist": np.zeros((5, 5), np.uint16)})),  # k + 1
    ("knn", dump_bundle({"idx": np.full((5, 4), 5, np.int64), "dist": np.zeros((5, 4), np.uint16)})),  # row 5 of 5
    ("knn", dump_bundle({"idx": np.zeros((5, 4), np.int64), "dist": np.full((5, 4), 65, np.uint16)})),  # > L
])
def test_malformed_round_0_uploads_are_refused(kind, body):
    with pytest.raises(ProtocolError):
        _check_blocked_input(kind, body, 5, P)
