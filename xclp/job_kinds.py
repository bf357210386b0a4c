"""The kinds of job, in one registry: for each, its machine's phases, the phase each of its topics
belongs to, and the rules of its stored messages — each topic's size limit, which bodies are
opaque to the coordinator (relayed, never parsed at upload), which messages no later step reads. A
driver that stores, counts or shows a job's messages (the service's uploads, byte counts, pruning
and timeline, the command line's progress bar) picks the rules by the job's kind here instead of
writing its own phase list or naming topics; the rules themselves live with each machine
(xclp.protocol and xclp.prediction_topics for a prediction job, xclp.training_topics for a training
run). Light: no torch.

Each rule takes the same arguments for every kind (a kind ignores what it does not need):
`max_body(topic, site, params, state, mail)` — the most bytes `site`'s upload of `topic` may carry
(None: only the driver's own limit), `params` the job's parameters, `state` its machine's state,
`mail` what the job's mailbox holds; `opaque(topic)`; `prunes(state)` — whether any message may be
obsolete now (a driver need not look otherwise); `obsolete(topic, state)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xclp import prediction_topics, protocol, training_topics


@dataclass(frozen=True)
class JobKind:
    phases: tuple[str, ...]  # in order; the last ("done") is where a job ends, not a phase it spends time in
    topic_phase: Callable[[str], str]
    max_body: Callable[[str, str, Any, Any, Any], int | None]
    opaque: Callable[[str], bool]
    prunes: Callable[[Any], bool]
    obsolete: Callable[[str, Any], bool]
    topic_kinds: tuple[str, ...]  # the first segment of each of its topics

    @property
    def steps(self) -> tuple[str, ...]:
        """The phases a job spends time in (each with its deadline and its line on a timeline)."""
        return self.phases[:-1]


# A training run's rules read only the topic and the rounds it has closed (TrainState.history).
def _train_max_body(topic: str, site: str, params: Any, state: Any, mail: Any) -> int | None:
    return training_topics.max_body(topic)


def _train_obsolete(topic: str, state: Any) -> bool:
    return training_topics.obsolete(topic, len(state.history))


JOB_KINDS = {
    "predict": JobKind(protocol.JOB_PHASES, prediction_topics.topic_phase, prediction_topics.max_body,
                       prediction_topics.opaque, prediction_topics.prunes, prediction_topics.obsolete,
                       prediction_topics.TOPIC_KINDS),
    "train": JobKind(training_topics.TRAIN_PHASES, training_topics.topic_phase, _train_max_body,
                     lambda topic: False, lambda state: True, _train_obsolete, training_topics.TOPIC_KINDS),
}


def job_kind(kind: str) -> JobKind:
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r} (one of {', '.join(JOB_KINDS)})") from None
