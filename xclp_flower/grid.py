"""A Flower Grid in one process: the ServerApp's messages go straight to each node's ClientApp (no
SuperLink, no Ray) — for the tests and quick runs. Between two calls every node's Context goes
through Flower's own protobuf serialisation, as a SuperNode keeps it, so a ClientApp that left
anything outside Context.state, or anything Flower cannot carry, fails here as it would deployed;
and each call is a fresh FlowerSite, as each message is a fresh process there."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE = 1  # the SuperLink's node id in Flower


class InProcessGrid(Grid):
    replies_at_once = True  # a message is answered (or, vanished, never) when pushed: nothing to poll for

    def __init__(self, client_app: ClientApp, node_configs: list[dict], run_id: int = 1):
        self.client_app = client_app
        self._run_id = run_id
        self.contexts = {100 + i: Context(run_id=run_id, node_id=100 + i, node_config=dict(cfg), state=RecordDict(),
                                          run_config={}) for i, cfg in enumerate(node_configs)}
        self._ids = itertools.count(1)
        self._replies: dict[str, Message] = {}
        self.seen: list[tuple[str, int, dict]] = []  # every payload both ways ("to"/"from", node, fields)
        self.vanish_after: dict[int, int] = {}  # node → how many messages it answers before it goes silent
        self.vanish_in: dict[int, str] = {}  # node → the step (or job phase) at whose first message it goes silent
        self.taken: dict[int, int] = dict.fromkeys(self.contexts, 0)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SERVER_NODE, 0

    def set_run(self, run) -> None:  # the run is fixed at construction
        pass

    @property
    def run(self):
        return None

    @property
    def run_id(self) -> int:
        """The run every node's Context carries (a training run's job is named after it)."""
        return self._run_id

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:  # (deprecated in Flower: the ServerApp builds Messages)
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            mid = f"m{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid  # what the SuperLink would assign
            node = m.metadata.dst_node_id
            self.seen.extend(("to", node, dict(r)) for r in m.content.config_records.values())
            self.taken[node] += 1
            steps = {str(r.get("step", "")) for r in m.content.config_records.values()}
            # an XCLP job's messages name the job's phase (its state, "view"): vanish_in may name a phase
            steps |= {json.loads(bytes(r["view"]))["phase"] for r in m.content.config_records.values() if "view" in r}
            if self.vanish_in.get(node) in steps:
                self.vanish_after[node] = self.taken[node] - 1
            if self.taken[node] > self.vanish_after.get(node, self.taken[node]):
                ids.append(mid)  # a vanished SuperNode: the message is never answered
                continue
            reply = self.client_app(m, self.contexts[node])
            self.seen.extend(("from", node, dict(r)) for r in reply.content.config_records.values())
            self.contexts[node] = context_from_proto(context_to_proto(self.contexts[node]))
            self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
