"""The mail of a job, of every kind: who may be named as a sender or recipient (`COORDINATOR` beside
the sites), a message (`Send`), what has arrived as the coordinator's driver keeps it (`Mailbox`), a
site's messages (`Inbox`), and an upload that does not fit the job's order (`Inadmissible`). The
prediction machine (xclp.prediction_job) and the training machine (xclp.training_job) speak it; a
driver keeps the messages (a database, a dict, Flower's Grid) behind these few methods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from crypto.errors import ProtocolError

COORDINATOR = "coordinator"


class Mailbox(Protocol):
    """What has arrived so far, as the coordinator's driver keeps it."""

    def senders(self, recipient: str, topic: str) -> set[str]: ...

    def senders_of(self, recipient: str, topics: list[str]) -> dict[str, set[str]]:
        """`senders` of each of `topics` (every topic a key), in one look: a phase of m sites has m(m−1)/2
        pair topics, and asking each alone cost a status request 1,225 database reads at 50 sites."""
        ...

    def recipients(self, sender: str, topic: str) -> set[str]: ...

    def recipients_of(self, senders: list[str], topic: str) -> dict[str, set[str]]:
        """`recipients` of each of `senders`' `topic` (every sender a key), in one look: who a seed phase of
        m sites awaits asked m reads of every status request (bench.poll_load)."""
        ...

    def body(self, sender: str, recipient: str, topic: str) -> bytes | None: ...

    def bodies_from(self, senders: list[str], recipient: str, topic: str) -> dict[str, bytes | None]:
        """`body` of each of `senders`' `topic` to `recipient` (every sender a key), in one look: the
        graph's size is the roster's announces, which every upload's admission and every status read."""
        ...


class Inbox(Protocol):
    """The messages addressed to one site. `wait`: the machine can do nothing else until this one
    comes (a driver may long-poll for it)."""

    def get(self, topic: str, sender: str = COORDINATOR, wait: bool = False) -> bytes | None: ...


@dataclass(frozen=True)
class Send:
    sender: str
    recipient: str
    topic: str
    body: bytes


class Inadmissible(ProtocolError):
    """An upload that does not fit the job's order: `conflict` — not now (another phase or attempt; a
    driver answers 409) —, else never (a topic or recipient that no step of the job has; 422)."""

    def __init__(self, message: str, conflict: bool = False):
        super().__init__(message)
        self.conflict = conflict
