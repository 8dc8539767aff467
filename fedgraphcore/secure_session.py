"""The server's part of secure aggregation in a session: key agreement, mask values, unmasking.

:class:`SecureAggregation` is the part of :class:`fedgraphcore.session.ServerSession` that sets up
pairwise masking (:mod:`fedgraphcore.privacy.secagg`), tells the clients how to mask each sum, and
unmasks the sums, with the survivors' sum recovered where a strategy can go on without a party
(:mod:`fedgraphcore.privacy.secagg_recovery`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Mapping

import numpy as np
from flwr.app import RecordDict

from fedgraphcore.config import SecAggConfig
from fedgraphcore.privacy.ledger import GUARANTEE_SECAGG
from fedgraphcore.privacy.secagg import (
    FixedPointEncoder,
    SecAggDropoutError,
    SecAggError,
    SecAggOverflowError,
    finest_scale,
    pack_id_bytes,
    relay_public_keys,
    unmask_sum,
)
from fedgraphcore.privacy.secagg_recovery import SEALED_SHARE_BYTES, SHARE_BYTES, inbox, recover_sum, recovery_threshold
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import (HELLO, KEY_ENDORSEMENT, SECAGG_AGREE, SECAGG_CONSISTENCY, SECAGG_ENDORSED, SECAGG_INBOX,
                      SECAGG_PARTICIPANTS, SECAGG_PEER, SECAGG_SETUP, SECAGG_SHARES, SECAGG_SIGNED, SECAGG_THRESHOLD,
                      SECAGG_UNMASK, SURVIVOR_SIGNATURE, ArraySpec, ProtocolError, ReplySpec, ValueSpec)


@contextmanager
def _stops_the_run(where: str):
    """A secure-aggregation input that is refused (a malformed key, a sum beyond the declared
    bounds) stops the run as a ProtocolError naming ``where``; a dropout stays a dropout."""
    try:
        yield
    except SecAggDropoutError:
        raise
    except SecAggError as err:
        raise ProtocolError(f"{where}: {err}") from None


class SecureAggregation:
    """Secure aggregation for :class:`fedgraphcore.session.ServerSession` (its clients, ledger, exchange)."""

    def setup_secure_aggregation(self) -> None:
        """Key agreement for pairwise masking (once per run).

        Each client creates an X25519 key pair and uploads its public key: in
        its hello reply when :meth:`connect` was told the run is secure, else
        in a ``secagg_setup`` round. The server relays all public keys (with
        the next step's request, or in a ``secagg_agree`` round after
        ``secagg_setup``); each pair of clients derives its shared mask seed
        (HKDF), which the server never sees. Party ids are the clients'
        partition ids.
        """
        if self._secagg_ready:
            return
        advertised, step = self._hello_keys, HELLO
        if not advertised:
            replies = self.broadcast(SECAGG_SETUP, pack(values={"session_id": self._secagg_session_id()}),
                                     ReplySpec(values=("public_key", KEY_ENDORSEMENT)))
            advertised = {self.partition_of(n): (v["public_key"], v[KEY_ENDORSEMENT])
                          for n, v in ((n, unpack(c)[1]) for n, c in replies.items())}
            step = SECAGG_SETUP
        with _stops_the_run(f"step '{step}'"):  # a key not 32 bytes, or another party's, names the party
            relayed = pack_id_bytes(relay_public_keys({p: key for p, (key, _) in advertised.items()},
                                                      expected_parties=range(len(self.clients))))
        endorsements = {SECAGG_ENDORSED + str(p): bytes(e) for p, (_, e) in advertised.items()}
        self._endorsed = any(endorsements.values())
        if step == HELLO:
            self._peer_keys = {**{SECAGG_PEER + party: key for party, key in relayed.items()}, **endorsements}
        else:
            self.broadcast(SECAGG_AGREE, pack(values={**relayed, **endorsements}),
                           ReplySpec(numbers={"peers": ValueSpec(whole=True, low=1)}))
        self.ledger.add_mechanism(
            "secure-aggregation",
            protects="every upload marked masked: the server sees only the sum over the clients that mask "
                     "together (all clients, or a group of them where a strategy says so, e.g. kcagc's tree)",
            params={"key_agreement": "X25519+HKDF-SHA256", "prg": "ChaCha20",
                    "ring": "Z_2^32 or Z_2^64 per sum, the smaller one in which the declared bound cannot wrap "
                            "(the upload's dtype, uint32 or uint64, says which)",
                    "scale": SecAggConfig.of(self.config).scale,
                    "finer_scale": "kcagc and fedspectral-plus's degree sum mask at the finest power-of-two scale "
                                   "their ring allows, never coarser than scale (the message values give it)",
                    "endorsed_keys": self._endorsed},
            guarantee=GUARANTEE_SECAGG,
        )
        self._recovered: list[dict] = []  # the recoverable sums that went on without a party
        self._secagg_ready = True

    def _secagg_session_id(self) -> str:
        return f"{self.config['strategy']}-{self.config['seed']}-{time.time_ns()}"

    def secagg_values(self, name: str, bound: float, finest: bool = False, recover: bool = False) -> dict:
        """Message values telling the clients how to mask array ``name``.

        A fresh tag per call gives fresh masks; ``bound`` is the largest
        absolute value any single client may contribute (checked on the
        client, so the true sum cannot wrap around the ring). The fixed-point
        scale is ``secagg.scale``, or with ``finest`` the finest power of two
        that the ring ``secagg.scale`` picks still holds (never coarser): for
        sums of values that may lie far below ``1 / secagg.scale``. A bound
        derived from the data (a sum over a client's rows) that the 64-bit
        ring cannot hold at ``secagg.scale`` gets the finest scale it can hold:
        a sum over many rows needs no finer resolution than one row.
        ``recover``: the strategy can go on without a party in this sum (its
        ``tolerates_dropouts``); see :meth:`recovers`.
        """
        if not self._secagg_ready:
            raise ProtocolError("secure aggregation used before setup_secure_aggregation()")
        scale, parties = SecAggConfig.of(self.config).scale, len(self.clients)
        try:
            FixedPointEncoder(scale, bound, parties)
        except SecAggOverflowError:
            scale = finest_scale(bound, parties, 64)
            if scale < 1.0:
                raise ProtocolError(f"secure sum {name!r}: {parties} clients x bound {bound:.6g} does not fit the "
                                    "64-bit ring even at resolution 1; valid: fewer rows per client or a lower "
                                    "secagg.bound")
        if finest:
            ring = FixedPointEncoder(scale, bound, parties).ring_bits
            scale = max(scale, finest_scale(bound, parties, ring))
        values = {
            "secagg_tag": f"{self._round + 1}:{name}",
            "secagg_scale": scale,
            "secagg_bound": float(bound),
            "secagg_parties": parties,
        }
        return {**values, **self._recovery_values()} if recover else values

    def _recovery_values(self) -> dict:
        """The parties (the clients left) and threshold (a majority of them) of a sum that survives
        dropouts (fedgraphcore.privacy.secagg_recovery): where the run may go on without a party (three or
        more clients left, ``min-clients`` below their number), or where one has gone already (the
        masks must cancel among those left, at least two: a sum over one is its input). Else a
        dropout stops the run anyway, and the sum needs no unmask round."""
        live = sorted(self.partition_of(n) for n in self.node_ids)
        may_drop = len(live) >= 3 and self.min_clients < len(live)
        if not (may_drop or 2 <= len(live) < len(self.clients)):
            return {}
        return {SECAGG_THRESHOLD: recovery_threshold(len(live)), SECAGG_PARTICIPANTS: live}

    @staticmethod
    def recovers(values: Mapping) -> bool:
        """Whether the sum of ``values`` (:meth:`secagg_values`) survives dropouts: each client
        adds a self mask and seals its shares for its peers (:meth:`secure_reply`), and
        :meth:`secure_sum` takes one more round, ``secagg_unmask``, to remove the masks. Its
        step's exchange then goes on without a client that does not answer (``require_all``
        False)."""
        return SECAGG_THRESHOLD in values

    def secure_reply(self, spec: ReplySpec, values: Mapping) -> ReplySpec:
        """``spec`` of a masked step, with the sealed shares a client adds to a recoverable upload
        (one 60-byte row per client: its share of its self-mask seed for that client alone)."""
        if not self.recovers(values):
            return spec
        rows = ArraySpec(shape=(len(self.clients), SEALED_SHARE_BYTES), kind="u", masked=True)
        return replace(spec, arrays={**spec.arrays, SECAGG_SHARES: rows})

    def secure_sum(self, replies: Mapping[int, RecordDict], name: str, values: Mapping,
                   parties=None) -> np.ndarray:
        """Unmask the sum of the masked arrays ``name`` over ``parties`` (partition
        ids, default every client); all of them must be present, and the sum must lie
        within the parties' declared bounds (else an upload was malformed: stop). A
        recoverable sum (:meth:`recovers`) is over the parties that answered instead."""
        encoder = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
        if self.recovers(values):
            total = self._recovered_sum(replies, name, values, encoder)
        else:
            uploads = {self.partition_of(n): unpack(c)[0][name] for n, c in replies.items()}
            expected = set(range(len(self.clients))) if parties is None else set(parties)
            with _stops_the_run(f"secure sum {values['secagg_tag']!r}"), self._needs_every_party():
                total = unmask_sum(uploads, expected, encoder)
        self.stats.secure_aggregations += 1
        return total

    @contextmanager
    def _needs_every_party(self):
        """A dropout in a sum that cannot be recovered, said as such."""
        try:
            yield
        except SecAggDropoutError as err:
            raise SecAggDropoutError(err.missing, f"strategy {self.config['strategy']} needs every party's upload "
                                                  "in this sum") from None

    def _recovered_sum(self, replies: Mapping[int, RecordDict], name: str, values: Mapping,
                       encoder: FixedPointEncoder) -> np.ndarray:
        """The sum over the parties whose upload arrived, after the ``secagg_unmask`` round: down,
        to each survivor, the survivors, the dropped parties, the array's size and the sealed shares
        addressed to it (``secagg_inbox``); up, its shares of the survivors' self-mask seeds and its
        pair masks with the dropped parties (:func:`fedgraphcore.privacy.secagg_recovery.unmask_response`)."""
        tag, threshold = str(values["secagg_tag"]), int(values[SECAGG_THRESHOLD])
        participants = [int(p) for p in values[SECAGG_PARTICIPANTS]]
        arrays = {self.partition_of(n): unpack(c)[0] for n, c in replies.items()}
        uploads = {p: a[name] for p, a in arrays.items()}
        survivors, dropped = sorted(uploads), sorted(set(participants) - set(uploads))
        if len(survivors) < threshold:
            raise SecAggDropoutError(dropped, f"{len(survivors)} uploads of {tag!r}, below the threshold {threshold}")
        size = next(iter(uploads.values())).size
        request = {**{k: values[k] for k in ("secagg_tag", "secagg_scale", "secagg_bound", "secagg_parties")},
                   "secagg_survivors": survivors, "secagg_dropped": dropped, "secagg_size": size}
        if self._endorsed:  # members with identity keys: every survivor signs the split first
            request.update(self._survivor_signatures(replies, request))
        rows = {p: a[SECAGG_SHARES] for p, a in arrays.items()}
        contents = {n: pack({SECAGG_INBOX: inbox(rows, self.partition_of(n), survivors)}, request) for n in replies}
        spec = ReplySpec(arrays={"self_shares": ArraySpec(shape=(len(survivors), SHARE_BYTES), kind="u"),
                                 "correction": ArraySpec(shape=(size if dropped else 0,), kind="u")})
        answers = {self.partition_of(n): unpack(c)[0] for n, c in
                   self.exchange(SECAGG_UNMASK, contents, spec, require_all=False).items()}
        responses = {p: ({u: a["self_shares"][i].tobytes() for i, u in enumerate(survivors)}, a["correction"])
                     for p, a in answers.items()}
        with _stops_the_run(f"secure sum {tag!r}"):
            total = recover_sum(uploads, participants, encoder, responses, threshold, tag)
        self._record_recovery(tag, survivors, dropped)
        return total

    def _survivor_signatures(self, replies: Mapping[int, RecordDict], request: dict) -> dict:
        """The consistency round (:mod:`fedgraphcore.privacy.roster`): each survivor signs the split of
        ``request``; every signature, as ``secagg_signed.<party>`` values for the unmask request. A
        survivor that does not sign stops the sum (its peers would refuse to unmask without it)."""
        told = {k: request[k] for k in ("secagg_tag", "secagg_survivors", "secagg_dropped")}
        answers = self.exchange(SECAGG_CONSISTENCY, {n: pack(values=told) for n in replies},
                                ReplySpec(values=(SURVIVOR_SIGNATURE,)), require_all=False)
        signed = {self.partition_of(n): unpack(c)[1][SURVIVOR_SIGNATURE] for n, c in answers.items()}
        missing = set(request["secagg_survivors"]) - set(signed)
        if missing:
            raise SecAggDropoutError(missing, f"no signature of the survivor set of {request['secagg_tag']!r}, which "
                                              "every survivor must sign")
        return {SECAGG_SIGNED + str(p): bytes(signature) for p, signature in signed.items()}

    def _record_recovery(self, tag: str, survivors: list[int], dropped: list[int]) -> None:
        """The privacy ledger's entry for sums that survive dropouts, with every sum that went on
        without a party: its tag, survivors and dropped parties (what the server learns)."""
        if dropped:
            self._recovered.append({"tag": tag, "survivors": survivors, "dropped": dropped})
        self.ledger.add_mechanism(
            "secure-aggregation:dropout-recovery",
            protects="the uploads of a secure sum that goes on without a party (double masking: a self mask "
                     "per sum, Shamir-shared among the sum's parties, sealed for each)",
            params={"threshold": "a majority of the sum's parties (clients refuse less)",
                    "server_learns": "the survivors' sum and which parties dropped; per sum, each survivor's "
                                     "one-time self-mask seed and, where a party dropped, the survivors' pair "
                                     "masks with it: neither tells anything about an input",
                    "recovered": list(self._recovered)},
            guarantee=GUARANTEE_SECAGG,
        )
