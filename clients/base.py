"""Base class of every method's client side.

The ClientApp builds one client object per message and calls
:meth:`ClusteringClient.handle`; the client answers the protocol step named by
the message's action. Anything a client must remember between steps goes into
``context.state`` (Flower keeps it per node for the whole run) via
:meth:`save` / :meth:`load`.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, Context, RecordDict

from app.config import RunConfig
from app.data import parties
from app.data.types import Shard
from app.privacy.secagg import FixedPointEncoder, SecAggParty, unpack_id_bytes
from app.transport import pack, unpack


class ClusteringClient:
    """Client side of one method. Subclasses add one ``on_<action>`` per step."""

    actions: ClassVar[tuple[str, ...]] = ()  # answered as ``query.<action>``
    train_actions: ClassVar[tuple[str, ...]] = ()  # answered as ``train.<action>`` (weight training)
    #: steps every client answers, whatever the method
    common_actions: ClassVar[tuple[str, ...]] = ("hello", "labels", "secagg_setup", "secagg_agree")

    def __init__(self, shard: Shard, config: RunConfig, context: Context) -> None:
        self.shard = shard
        self.config = config
        self.context = context

    def handle(self, action: str, content: RecordDict) -> RecordDict:
        """Answer protocol step ``action`` (``on_<action>(arrays, values)``)."""
        arrays, values = unpack(content)
        reply_arrays, reply_values = getattr(self, f"on_{action}")(arrays, values)
        return pack(reply_arrays, reply_values)

    # -- steps every method shares -------------------------------------------
    def on_hello(self, arrays, values):
        """Say which partition this node holds and its size (counts only). A party with its
        own data (``dataset = 'parties'``) also says how many graphs it holds and, where every
        party must hold the same nodes (edge, vertical), the digest of its ordered node IDs
        (:func:`app.data.parties.node_set_digest`), never the IDs."""
        s = self.shard
        summary = {
            "partition_id": s.client_id,
            "num_partitions": s.num_clients,
            "dataset": s.dataset,
            "partitioner": s.partitioner,
            "num_rows": int(len(s.node_ids)) if s.node_ids is not None else 0,
        }
        if s.dataset == parties.PARTIES:
            summary["num_graphs"] = s.num_graphs
            if parties.family(s.partitioner) in parties.SHARED_NODES:
                summary["node_digest"] = parties.node_set_digest(s.keys)
        return {}, summary

    def on_labels(self, arrays, values):
        """Receive the final cluster labels of this client's items (in its row order) and keep
        them; a party with its own data also writes them with its own IDs to labels.csv in its
        node config's out-dir."""
        labels = arrays["labels"]
        self.save("labels", labels=labels)
        s = self.shard
        if s.dataset == parties.PARTIES:
            item = "graph" if parties.family(s.partitioner) == "graphs" else "node"
            out = self.context.node_config.get(parties.OUT_KEY)
            if out:
                parties.write_party_labels(str(out), s.keys, labels, item)
        return {}, {"received": int(labels.size)}

    # -- secure aggregation (see app.privacy.secagg) -------------------------
    def on_secagg_setup(self, arrays, values):
        """Create this party's X25519 key pair; upload the public key only."""
        party = SecAggParty.generate(self.shard.client_id, str(values["session_id"]))
        self._save_party(party)
        return {}, {"public_key": party.public_key_bytes()}

    def on_secagg_agree(self, arrays, values):
        """Derive the pairwise mask seeds from the relayed public keys."""
        party = self._load_party()
        party.agree(unpack_id_bytes(values))
        self._save_party(party)
        return {}, {"peers": len(party.peers)}

    def masked(self, array: np.ndarray, values, participants=None) -> np.ndarray:
        """``array`` fixed-point encoded and pairwise masked (uint32 / uint64 ring) for a secure sum.

        ``values`` are the message values from ``ServerSession.secagg_values``;
        ``participants`` (partition ids) restricts the masks to a sub-group's
        sum (default: every client).
        """
        encoder = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
        party = self._load_party()
        out = party.mask(np.asarray(array, dtype=np.float64), str(values["secagg_tag"]), encoder,
                         participants=participants)
        self._save_party(party)  # the party remembers used tags
        return out

    def _save_party(self, party: SecAggParty) -> None:
        self.context.state["secagg"] = ArrayRecord({"party": Array(party.to_array())})

    def _load_party(self) -> SecAggParty:
        return SecAggParty.from_array(self.context.state.array_records["secagg"]["party"].numpy())

    # -- state between steps --------------------------------------------------
    def save(self, record: str, **arrays: np.ndarray) -> None:
        """Keep ``arrays`` in ``context.state[record]`` (replacing it)."""
        self.context.state[record] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})

    def load(self, record: str) -> dict[str, np.ndarray]:
        """Arrays saved by :meth:`save` (KeyError if the step before was skipped)."""
        return {k: v.numpy() for k, v in self.context.state.array_records[record].items()}

    def released_once(self, action: str, arrays, values, compute, most: int | None = None) -> tuple[dict, dict]:
        """The reply to a request whose answer carries fresh privacy noise, computed once:
        the same request sent again (its reply timed out and ``retries`` > 0) gets the
        kept reply back, so a retry is no second draw for the server to average and the
        accountant's count of releases stays exact. ``compute()`` returns the reply's
        arrays (a noised reply carries no values). The server makes every release's
        request differ (its round), so only a re-sent request matches. ``most``: the
        releases of ``action`` this client's privacy budget covers; a request for one
        more is refused (the server must not be able to spend more than the budget)."""
        digest = request_digest(arrays, values)
        record = f"released:{action}"
        made = 0
        if record in self.context.state.array_records:
            kept = self.load(record)
            made = int(kept.pop("releases")[0])
            if np.array_equal(kept.pop("request"), digest):
                return kept, {}
        if most is not None and made >= most:
            raise ValueError(f"refusing release {made + 1} of {action}: this client's privacy budget covers {most}")
        reply = compute()
        self.save(record, request=digest, releases=np.array([made + 1]), **reply)
        return reply, {}


def request_digest(arrays: dict, values: dict) -> np.ndarray:
    """SHA-256 of a request's arrays and values (equal only for the same request)."""
    digest = hashlib.sha256(repr(sorted(values.items())).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{a.dtype}:{a.shape}".encode())
        digest.update(a.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.uint8)
