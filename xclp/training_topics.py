"""A training run's messages as the drivers store them: its phases, the phase each topic belongs to,
each topic's size limit, and which topics no later step reads. The machine that sends and admits
them is xclp.training_job; these rules sit apart from it because the drivers read them where they
must not load the strategies (and torch with them): the service's byte counts and pruning, the
command line's progress bar.

Topics of a run (t a round, a an attempt): `hello`, `keys`, setup's standardisation sum (`stats-ask/a`,
a site's masked `stats/a`, `stats-total`: xclp.training.input_scaling), the round-0 model (`model/0`), `plan/t`,
a site's upload (`update/t`, `update/t/a` masked, `votes/t`), `unmask/t` and `reveal/t`, the round's
broadcast (`model/t`, `consensus/t`, `labels/t`), `eval`.
"""

from __future__ import annotations

# The first segment of each topic of a run (its kind).
TOPIC_KINDS = ("hello", "keys", "stats", "stats-ask", "stats-total", "model", "plan", "update", "votes", "unmask", "reveal", "consensus", "labels", "eval")

# The phases of a run, in order; "done" is where it ends (TrainState.phase takes these values).
TRAIN_PHASES = ("setup", "round", "evaluate", "done")

# A hello (a site's size, features, key), an evaluation (its scores) and a standardisation share are small; every other
# topic is a round's model or votes, bounded by the service's own limit on a body.
MAX_SMALL_BODY = 1 << 26
SMALL_TOPICS = ("hello", "eval", "stats")

# What a later step reads of a closed round: the agents and round t + 1's XCLP job read model/t (a
# restarted agent too); the updates of a closed round and the models before t − 1 are read by nothing.
# Votes and consensus labels are small and stay as the run's record.
PRUNED_KINDS = ("update", "model")


def topic_phase(topic: str) -> str:
    """The phase a training run's message belongs to, by its topic (bytes are counted by phase)."""
    kind = topic.split("/")[0]
    if kind in ("hello", "keys", "identities", "stats", "stats-ask", "stats-total") or topic == "model/0":
        return "setup"
    return "evaluate" if kind == "eval" else "round"  # plan/t, update/t, votes/t, model/t, consensus/t, labels/t


def max_body(topic: str) -> int | None:
    """The most bytes a site's upload of `topic` may carry; None: only the driver's own limit."""
    return MAX_SMALL_BODY if topic.split("/")[0] in SMALL_TOPICS else None


def obsolete(topic: str, rounds_done: int) -> bool:
    """Whether no later step of a run that has closed `rounds_done` rounds reads `topic` (a driver may
    delete it): the updates of rounds ≤ rounds_done and the models before rounds_done − 1."""
    kind, r = (topic.split("/") + [""])[:2]  # update/t, update/t/attempt, model/t
    if kind not in PRUNED_KINDS or not r.isdigit():
        return False
    return int(r) <= rounds_done if kind == "update" else int(r) < rounds_done - 1
