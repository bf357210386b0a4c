"""What an in-process job reports: the bytes each party sent in each phase (`ByteMeter`), and the
result with its timings (`SimulationResult`) — the in-process driver's (xclp.simulation)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from xclp.data import Dataset
from xclp.job_params import JobParams
from xclp.prediction_job import PredictState
from xclp.propagation import Prediction
from xclp.protocol import CoordinatorSession


@dataclass
class ByteMeter:
    """Bytes sent, by (party, phase); the coordinator's relaying is not counted twice."""

    sent: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    tap: Callable[[str, str, bytes], None] | None = None  # sees every message (tests, audits)

    def add(self, party: str, phase: str, data: bytes | None) -> bytes | None:
        if data is not None:
            self.sent[(party, phase)] += len(data)
            if self.tap is not None:
                self.tap(party, phase, data)
        return data

    def report(self) -> dict:
        by_party: dict[str, dict[str, int]] = defaultdict(dict)
        by_phase: dict[str, int] = defaultdict(int)
        for (party, phase), n in sorted(self.sent.items()):
            by_party[party][phase] = n
            by_phase[phase] += n
        return {"total": int(sum(self.sent.values())), "by_phase": dict(by_phase), "by_party": dict(by_party)}


@dataclass
class SimulationResult:
    predictions: dict[str, Prediction]
    labels: np.ndarray  # aligned with the data set's rows
    confidence: np.ndarray
    timings: dict[str, float]
    bytes: dict
    solver: str
    params: JobParams
    job: PredictState | None = None  # where the job ended: who dropped in which phase, each sum's attempt
    coordinator: CoordinatorSession | None = None  # the session that built the graph (benchmarks read a blocked graph's)


def split_by_site(ds: Dataset) -> dict[str, np.ndarray]:
    return {s: np.flatnonzero(ds.site == s) for s in ds.sites}


