"""The protocol's order and count, as a member's client holds them whatever the server sends.

A member's client answers requests it cannot trust (the ServerApp is the operator's code), so
every reply is a release, and a server that may send any message in any order could otherwise
ask for the same release again and again (a label oracle), or start the protocol over (a second
hello that resets what the node audits). :class:`StepGuard` keeps, per run, what the client
answered:

* ``hello`` first and once per run: a step before it, and a second hello with another
  request, are refused (rule ``protocol-order``);
* each step at most as often as the protocol needs it (the client's
  :meth:`~clients.base.ClusteringClient.step_limits`, from its own run config), else refused
  (rule ``protocol-count``);
* a request sent again (the same digest as the step's last one: a retry after a lost reply) is
  answered with the first reply, no second release;
* a reply that labels the node's rows is a label release of its dataset, counted over every run
  in the node's release record (:mod:`fedgraphcore.privacy.releases`) and capped by its policy's
  ``label-releases`` (rule ``label-releases``).

The counts live in ``context.state``; a node whose context is fresh within a run it already
answered (a restarted SuperNode) continues from its release record's lines for the run.
"""

from __future__ import annotations

import json
import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from fedgraphcore.party_outputs import run_number
from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.wire import HELLO

#: ``context.state`` record of the steps answered in this run: the hello's request digest, counts
PROTOCOL = "protocol-steps"
#: ``context.state`` record (one per step) of its last request's digest and reply
ANSWERED = "answered:"
#: a step whose method keeps its own reply (:meth:`clients.base.ClusteringClient.released_once`)
OWN = "released:"
#: :meth:`StepGuard.kept` of a request sent again whose method gives its kept reply back
REPEATED = object()


class StepGuard:
    """What one client answered in its run (see module docstring); ``client`` a
    :class:`clients.base.ClusteringClient`."""

    def __init__(self, client) -> None:
        self.client = client
        self.state: RecordDict = client.context.state

    def _steps(self) -> tuple[str, dict[str, int]]:
        """(the hello's request digest, or "" before it; answers per step) of this run."""
        kept = self.state.config_records.get(PROTOCOL)
        if kept is not None:
            return str(kept["hello"]), json.loads(str(kept["counts"]))
        run, hello, counts = run_number(self.client.context.run_id), "", {}
        if self.client.release_record.directory is not None:  # a restarted node continues its run
            for record in self.client.release_record.records():
                if record["run"] == run:
                    counts[record["action"]] = counts.get(record["action"], 0) + 1
                    hello = record["request"] if record["action"] == HELLO else hello
        return hello, counts

    def counts(self) -> dict[str, int]:
        """The steps answered in this run, each with its count."""
        return self._steps()[1]

    def kept(self, action: str, digest: np.ndarray) -> RecordDict | object | None:
        """The reply kept for ``action`` if its last request had this ``digest`` (the first reply to a
        request sent again); :data:`REPEATED` when the step's method keeps that reply itself (it hands
        it back without a second release); None for a request not answered before."""
        kept = self.state.array_records.get(ANSWERED + action)
        if kept is None or kept["request"].numpy().tobytes() != digest.tobytes():
            return None
        if "reply" not in kept:
            return REPEATED
        return recorddict_from_proto(RecordDictProto.FromString(kept["reply"].numpy().tobytes()))

    def check(self, action: str, digest: np.ndarray, values) -> None:
        """Refuse ``action`` out of the protocol's order or beyond its count, or a label release
        beyond this node's ``label-releases`` for the dataset (see module docstring)."""
        hello, counts = self._steps()
        run = run_number(self.client.context.run_id)
        if action == HELLO and hello:
            if hello == bytes(digest).hex():
                return  # a restarted node's hello again: the same request
            raise PrivacyRefusal("protocol-order", f"a second hello with another request in run {run}; this "
                                                   "client answers one hello per run")
        if action != HELLO and not hello:
            raise PrivacyRefusal("protocol-order", f"'{action}' before hello in run {run}; valid: hello first")
        limit = self.client.step_limits().get(action)
        if limit is not None and counts.get(action, 0) >= limit:
            raise PrivacyRefusal("protocol-count", f"'{action}' a {counts[action] + 1}th time in run {run}; this "
                                                   f"run's protocol needs it at most {limit} time(s)")
        if self.client.label_classes(action, values):
            self._check_label_releases(action)

    def _check_label_releases(self, action: str) -> None:
        cap = float(self.client.policy["label-releases"])
        if not math.isfinite(cap):
            return
        record = self.client.release_record
        with record.locked():
            made = sum(r["labels"] > 0 for r in record.records())
        if made >= cap:
            raise PrivacyRefusal("label-releases", f"'{action}' would be label release {made + 1} of this node's "
                                                   f"rows over every run; its label-releases={cap:g} "
                                                   f"(release record {record.where()})")

    def answered(self, action: str, digest: np.ndarray, values, reply: RecordDict) -> None:
        """Count ``action``'s answer, keep its reply for a request sent again, and record the release."""
        hello, counts = self._steps()
        counts[action] = counts.get(action, 0) + 1
        request = bytes(digest).hex()
        self.state[PROTOCOL] = ConfigRecord({"hello": request if action == HELLO else hello,
                                             "counts": json.dumps(counts, sort_keys=True)})
        keep = {"request": Array(np.asarray(digest, dtype=np.uint8))}
        own = self.state.array_records.get(OWN + action)
        if own is None or own["request"].numpy().tobytes() != digest.tobytes():
            keep["reply"] = Array(np.frombuffer(recorddict_to_proto(reply).SerializeToString(), dtype=np.uint8))
        self.state[ANSWERED + action] = ArrayRecord(keep)
        labels = self.client.label_classes(action, values)
        record = self.client.release_record
        if labels or record.directory is not None:  # in a run context: the label releases only
            with record.locked():
                record.append(run_number(self.client.context.run_id), self.client.shared.strategy, action, request, labels)
