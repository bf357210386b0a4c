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

And what else differs between the kinds, so that no driver compares a job's kind with a name (the layer
test, tests/test_layers.py): whether the job runs training rounds (`rounds`), when an upload is admitted
(`admit`, by its topic before its body; `admits_with_body`), the core's parameters of the job (`params`)
and the ledger of what it releases about the sites' labels (`privacy`). (Who a job's step awaits is its
machine's `awaited`, for either kind.)

A driver keeps a job's machine state as bytes it never reads (`state.to_bytes()`, one record, read back
by `load`); a new job's is `new_state(sites)`. What it lists and shows is the state's `summary()`;
what it hands a site is `state.view_for(site).to_bytes()` — the one wire form of a state, for the
service's agents as for Flower's ClientApps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xclp import prediction_job, prediction_topics, protocol, training_topics
from xclp.job_params import JobParams


@dataclass(frozen=True)
class JobKind:
    phases: tuple[str, ...]  # in order; the last ("done") is where a job ends, not a phase it spends time in
    topic_phase: Callable[[str], str]
    max_body: Callable[[str, str, Any, Any, Any], int | None]
    opaque: Callable[[str], bool]
    prunes: Callable[[Any], bool]
    obsolete: Callable[[str, Any], bool]
    topic_kinds: tuple[str, ...]  # the first segment of each of its topics
    name: str
    # A job of training rounds: its results (each round's metrics, the final evaluation, the global model)
    # kept with the job, its progress counted in rounds, an XCLP child job per round.
    rounds: bool
    # The order's admission of an upload by its topic, before its body arrives:
    # admit(params, state, mail, site, to, topic), Inadmissible (xclp.mail) if the order has no place for it.
    admit: Callable[[Any, Any, Any, str, str, str], None]
    # True: an upload is admitted with its body, by the machine (xclp.training_job.TrainCoordinator.admit).
    admits_with_body: bool
    params: Callable[[dict], Any]  # the core's parameters from the job's JSON (None: the machine reads them itself)
    privacy: Callable[[dict], dict]  # the label-DP ledger of what the job releases, from its params ({}: none here)
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


def _predict_admit(params: JobParams, state, mail, site: str, to: str, topic: str) -> None:
    """The prediction machine's rule: who may send what, when (xclp.prediction_job.admit); which graph's
    hamming topics the job takes is known once the roster is."""
    blocked = prediction_topics.graph_mode(params, mail, state) == "blocked" if state.reached("seed") else None
    prediction_job.admit(state, site, to, topic, blocked=blocked)


def _admitted_with_body(params, state, mail, site: str, to: str, topic: str) -> None:
    """A training run's upload: admitted with its body, by its machine (`admits_with_body`)."""


# A state's class is imported where a state is made or loaded: the training machine's imports torch, and
# this registry is read by drivers that never touch a state (the command line's progress bar).
def _predict_state():
    from xclp.prediction_job import PredictState

    return PredictState


def _train_state():
    from xclp.training_job import TrainState

    return TrainState


JOB_KINDS = {
    "predict": JobKind(protocol.JOB_PHASES, prediction_topics.topic_phase, prediction_topics.max_body,
                       prediction_topics.opaque, prediction_topics.prunes, prediction_topics.obsolete,
                       prediction_topics.TOPIC_KINDS, name="predict", rounds=False, admit=_predict_admit,
                       admits_with_body=False, params=lambda p: JobParams(**p),
                       privacy=lambda p: JobParams(**p).privacy(), new_state=lambda sites: _predict_state().new(sites),
                       load=lambda data: _predict_state().from_bytes(data)),
    "train": JobKind(training_topics.TRAIN_PHASES, training_topics.topic_phase, _train_max_body,
                     lambda topic: False, lambda state: True, _train_obsolete, training_topics.TOPIC_KINDS,
                     name="train", rounds=True, admit=_admitted_with_body, admits_with_body=True,
                     params=lambda p: None, privacy=lambda p: {},
                     new_state=lambda sites: _train_state().new(sites), load=lambda data: _train_state().from_bytes(data)),
}


def job_kind(kind: str) -> JobKind:
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r} (one of {', '.join(JOB_KINDS)})") from None
