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

A driver keeps a job's machine state as bytes it never reads (`state.to_bytes()`, one record, read back
by `load`); a new job's is `new_state(sites)`. What it lists and shows is the state's `summary()`;
what it hands a site is `state.view_for(site).to_bytes()` — the one wire form of a state, for the
service's agents as for Flower's ClientApps.
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
    new_state: Callable[[list[str]], Any]  # a new job's machine state over its roster
    load: Callable[[bytes], Any]  # a machine state from its bytes (state.to_bytes())

    @property
    def steps(self) -> tuple[str, ...]:
        """The phases a job spends time in (each with its deadline and its line on a timeline)."""
        return self.phases[:-1]


# A training run's rules read only the topic and the rounds it has closed (TrainState.history).
def _train_max_body(topic: str, site: str, params: Any, state: Any, mail: Any) -> int | None:
    return training_topics.max_body(topic)


def _train_obsolete(topic: str, state: Any) -> bool:
    return training_topics.obsolete(topic, len(state.history))


# A state's class is imported where a state is made or loaded: the training machine's imports torch, and
# this registry is read by drivers that never touch a state (the command line's progress bar).
def _predict_state():
    from xclp.prediction_job import PredictState

    return PredictState


def _train_state():
    from xclp.training_job import TrainState

    return TrainState


JOB_KINDS = {
    "predict": JobKind(protocol.JOB_PHASES, protocol.topic_phase, prediction_topics.max_body,
                       prediction_topics.opaque, prediction_topics.prunes, prediction_topics.obsolete,
                       prediction_topics.TOPIC_KINDS, lambda sites: _predict_state().new(sites), lambda data: _predict_state().from_bytes(data)),
    "train": JobKind(training_topics.TRAIN_PHASES, training_topics.topic_phase, _train_max_body,
                     lambda topic: False, lambda state: True, _train_obsolete, training_topics.TOPIC_KINDS,
                     lambda sites: _train_state().new(sites), lambda data: _train_state().from_bytes(data)),
}


def job_kind(kind: str) -> JobKind:
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r} (one of {', '.join(JOB_KINDS)})") from None
