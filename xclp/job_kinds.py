"""The kinds of job, in one registry: for each, its machine's phases and the phase each of its topics
belongs to. A driver that stores, counts or shows a job's messages (the service's byte counts and
timeline, the command line's progress bar) picks the rules by the job's kind here instead of
writing its own phase list or parsing topics; the rules themselves live with each machine
(xclp.protocol for a prediction job, xclp.training_topics for a training run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xclp import protocol, training_topics


@dataclass(frozen=True)
class JobKind:
    phases: tuple[str, ...]  # in order; the last ("done") is where a job ends, not a phase it spends time in
    topic_phase: Callable[[str], str]

    @property
    def steps(self) -> tuple[str, ...]:
        """The phases a job spends time in (each with its deadline and its line on a timeline)."""
        return self.phases[:-1]


JOB_KINDS = {
    "predict": JobKind(protocol.JOB_PHASES, protocol.topic_phase),
    "train": JobKind(training_topics.TRAIN_PHASES, training_topics.topic_phase),
}


def job_kind(kind: str) -> JobKind:
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r} (one of {', '.join(JOB_KINDS)})") from None
