"""What a strategy sees of the federation: ordered clients and a fast exchange.

:class:`ServerSession` wraps a Flower ``Grid``. It waits for the configured
number of SuperNodes, runs the ``hello`` handshake (each client says which
partition it holds and how big its shard is: sizes only, no data), orders the
clients by partition id, and then gives the strategy :meth:`exchange` /
:meth:`broadcast`, which go through :func:`fedgraphcore.transport.exchange` and record
per-round timings, traffic, rejected replies and the uploads in the privacy
ledger. A strategy reports the end of each of its rounds with :meth:`round_done`
and the round's headline value (:mod:`fedgraphcore.progress` shows it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

import numpy as np

from fedgraphcore.config import RunConfig, SharedConfig
from fedgraphcore.data.parties import PARTIES, SHARED_NODES, family, item_offsets, node_set_mismatch, to_positions
from fedgraphcore.privacy.ledger import PrivacyLedger
from fedgraphcore.privacy.releases import server_learns
from fedgraphcore.progress import Convergence, Progress
from fedgraphcore.secure_session import SecureAggregation
from fedgraphcore.transport import (LEFT, NO_REPLY, NOT_RECEIVED, NOT_RECEIVED_RESENDS, CommStats, Exchange, describe, exchange,
                           pack, unpack)
from fedgraphcore.wire import HELLO, KEY_ENDORSEMENT, SECAGG_SESSION, ArraySpec, ProtocolError, ReplySpec, ValueSpec

HELLO_SPEC = ReplySpec(values=("dataset", "partitioner", "shard_cut"),
                       numbers={"partition_id": ValueSpec(whole=True, low=0),
                                "num_partitions": ValueSpec(whole=True, low=1),
                                "num_rows": ValueSpec(whole=True, low=0),
                                "num_graphs": ValueSpec(whole=True, low=0),
                                "num_edges": ValueSpec(whole=True, low=0),
                                "num_isolated": ValueSpec(whole=True, low=0)})

def party_hello_spec(partitioner: str) -> ReplySpec:
    """The hello reply of a party with its own data (``dataset = 'parties'``): the values of
    every hello and, where every party holds the same nodes, the digest of its ordered node IDs
    (:func:`fedgraphcore.data.parties.node_set_digest`)."""
    shared = family(partitioner) in SHARED_NODES
    return ReplySpec(values=HELLO_SPEC.values + (("node_digest",) if shared else ()), numbers=HELLO_SPEC.numbers)


SETTLE_S = 1.0


@dataclass(frozen=True)
class ClientInfo:
    """One connected client: its Flower node id, partition id, shard sizes (and the figures its
    strategy asked for with hello), and the arrays its strategy asked for with hello."""

    node_id: int
    partition_id: int
    summary: dict
    arrays: dict = field(default_factory=dict)


class PrivacyRefused(ProtocolError):
    """Clients refused a step by their node's privacy policy (``refusals``: partition id
    -> (rule, detail)); the run stops, whichever step it was."""

    def __init__(self, action: str, refusals: dict[int, tuple[str, str]], detail: str) -> None:
        self.action = action
        self.refusals = refusals
        super().__init__(f"step '{action}' refused by the privacy policy of {detail}")


def _check_one_cut(clients: list[ClientInfo]) -> None:
    """Shard files from different cuts of the data (another seed, other data or split parameters:
    each node's ``shard_cut``) hold overlapping or missing items; stop before the first step."""
    cuts: dict[str, list[int]] = {}
    for c in clients:
        cuts.setdefault(str(c.summary["shard_cut"]), []).append(c.partition_id)
    if len(cuts) > 1:
        listed = "; ".join(f"client{'s' * (len(ids) > 1)} {', '.join(map(str, ids))}: {cut or 'cut in memory'}"
                           for cut, ids in cuts.items())
        raise ProtocolError(f"the clients' shards come from different cuts of the data ({listed}); valid: the "
                            "shard files of one python -m app.data.prepare run")


def _with_values(contents: Mapping[int, RecordDict], values: Mapping) -> Mapping[int, RecordDict]:
    """Each node's content with ``values`` added to its message values (the peers' relayed keys)."""
    if not values:
        return contents
    out = {}
    for node, content in contents.items():
        arrays, own = unpack(content)
        out[node] = pack(arrays, {**own, **values})
    return out


@dataclass(frozen=True)
class HelloAsk:
    """What a strategy asks of every client in the hello handshake, beside its shard's counts:
    ``values`` sent with the request, ``reply`` what each client adds to its reply (its figures,
    kept in :attr:`ClientInfo.summary`, and arrays, kept in :attr:`ClientInfo.arrays`; checked
    like any reply), and with ``secure`` its secure-aggregation public key
    (:meth:`ServerSession.setup_secure_aggregation`)."""

    values: Mapping = field(default_factory=dict)
    reply: ReplySpec = field(default_factory=ReplySpec)
    secure: bool = False


class ServerSession(SecureAggregation):
    """The server's view of one run (see module docstring)."""

    def __init__(self, grid: Grid, config: RunConfig) -> None:
        self.grid = grid
        self.config = config
        shared = SharedConfig.of(config)
        self.timeout = shared.timeout
        self.stats = CommStats()
        self.ledger = PrivacyLedger()
        self.ledger.server_learns = server_learns(str(config["strategy"]))
        self.rejects: list[dict] = []
        self.clients: list[ClientInfo] = []
        self._round = 0
        self._secagg_ready = False
        self._hello_keys: dict[int, tuple] = {}  # partition id -> (public key, endorsement), when hello carried them
        self._peer_keys: dict[str, bytes] = {}  # relayed with the next step, then cleared
        self._order: dict[int, int] = {}
        self.dropped: dict[int, dict] = {}
        self.rejoined: list[dict] = []  # clients taken back after their SuperNode left and came back
        self._seen_gone: set[int] = set()  # dropped nodes seen missing from the federation since
        self._hello_sent: tuple[dict[int, RecordDict], ReplySpec] = ({}, HELLO_SPEC)
        self.min_clients = max(1, shared.min_clients)
        self.retries = shared.retries
        self.progress = Progress()
        self.parties = shared.dataset == PARTIES
        self.items: dict[int, int] = {}  # parties: node id -> its items (rows, or graphs)
        self.offsets: dict[int, int] = {}  # parties: node id -> where its items start among the positions
        self.journal = None  # an fedgraphcore.journal.Journal, which journals every completed step; set after hello

    @property
    def shared(self) -> SharedConfig:
        """The run's shared keys, typed (of ``config``, which the ServerApp completes after the handshake)."""
        return SharedConfig.of(self.config)

    # -- set-up ---------------------------------------------------------------
    def connect(self, ask: Callable[[int], HelloAsk] = lambda clients: HelloAsk()) -> list[ClientInfo]:
        """Wait for the SuperNodes, then run the ``hello`` handshake.

        ``num-clients`` > 0 waits for that many nodes; 0 takes every node
        connected once their number has been stable for ``SETTLE_S`` seconds.
        ``ask(clients)``: what the strategy asks of every client beside its
        shard's counts (:class:`HelloAsk`), sparing rounds of its own.
        """
        nodes = self._wait_for_nodes(self.shared.num_clients)
        want = len(nodes)
        spec, values = HELLO_SPEC, [{} for _ in nodes]
        if self.parties:  # partition ids by Flower node id, for parties whose node config names none
            spec = party_hello_spec(self.shared.partitioner)
            values = [{"partition_id": i, "num_partitions": want} for i in range(want)]
        asked = ask(want)
        extra = {SECAGG_SESSION: self._secagg_session_id()} if asked.secure else {}
        values = [{**v, **asked.values, **extra} for v in values]
        spec = ReplySpec(values=spec.values + (("public_key", KEY_ENDORSEMENT) if asked.secure else ()),
                         numbers={**spec.numbers, **asked.reply.numbers}, arrays=asked.reply.arrays,
                         same_length=asked.reply.same_length)
        contents = {n: pack(values=v) for n, v in zip(nodes, values)}
        self._hello_sent = (contents, spec)
        replies = self.exchange(HELLO, contents, spec, record=False)
        clients = []
        for node, content in replies.items():
            arrays, values = unpack(content)
            if values["num_partitions"] != want:
                raise ProtocolError(
                    f"node {node} holds partition {values['partition_id']} of "
                    f"{values['num_partitions']}, but num-clients={want}"
                )
            clients.append(ClientInfo(node, int(values["partition_id"]), values, arrays))
        clients.sort(key=lambda c: c.partition_id)
        self._hello_keys = {c.partition_id: (c.summary.pop("public_key"), c.summary.pop(KEY_ENDORSEMENT))
                            for c in clients if "public_key" in c.summary}
        ids = [c.partition_id for c in clients]
        if ids != list(range(want)):
            raise ProtocolError(f"partition ids {ids} are not 0..{want - 1} exactly once")
        _check_one_cut(clients)
        self.clients = clients
        self._order = {c.node_id: c.partition_id for c in clients}
        self._record_uploads(HELLO, replies.items(), spec)
        if self.parties:
            self._place_parties(clients)
        self.progress = Progress()  # its elapsed time counts from here: the engine's start-up is not the protocol's
        return clients

    def _place_parties(self, clients: list[ClientInfo]) -> None:
        """Parties with their own data: where every party must hold the same nodes, stop on
        differing node sets (one line with the counts); then each party's item count and
        offset among the server's positions (:func:`fedgraphcore.data.parties.item_offsets`)."""
        partitioner = self.shared.partitioner
        count = "num_graphs" if family(partitioner) == "graphs" else "num_rows"
        counts = {c.partition_id: int(c.summary[count]) for c in clients}
        if family(partitioner) in SHARED_NODES:
            problem = node_set_mismatch(partitioner, counts, {c.partition_id: c.summary["node_digest"] for c in clients})
            if problem:
                raise ProtocolError(problem)
        offsets = item_offsets(partitioner, [counts[c.partition_id] for c in clients])
        self.items = {c.node_id: counts[c.partition_id] for c in clients}
        self.offsets = {c.node_id: offset for c, offset in zip(clients, offsets)}

    def positions(self, step: str, node: int, ids) -> np.ndarray:
        """Item ids a client sent (node rows or graphs) as the server's item ids: unchanged from a
        partitioned dataset (they are global already); a party's rows 0..n-1 offset by the items
        of the parties before it (:func:`fedgraphcore.data.parties.to_positions`), an id outside its rows
        stopping the run."""
        if not self.parties:
            return np.asarray(ids, dtype=np.int64)
        try:
            return to_positions(ids, self.offsets[node], self.items[node])
        except ValueError as err:
            raise ProtocolError(f"step '{step}': client {self.partition_of(node)} (node {node}) sent {err}") from None

    def num_positions(self) -> int:
        """The items of all parties (parties with their own data): the server's positions."""
        if not self.items:
            return 0
        if family(self.shared.partitioner) in SHARED_NODES:
            return max(self.items.values())
        return sum(self.items.values())

    def _wait_for_nodes(self, want: int) -> list[int]:
        deadline = time.monotonic() + self.timeout
        nodes, stable_since = sorted(self.grid.get_node_ids()), time.monotonic()
        while True:
            now = time.monotonic()
            if want and len(nodes) >= want:
                return nodes[:want]
            if not want and nodes and now - stable_since >= SETTLE_S:
                return nodes
            if now > deadline:
                raise ProtocolError(
                    f"only {len(nodes)} SuperNodes connected within timeout={self.timeout:g} s "
                    f"(num-clients={want})"
                )
            time.sleep(0.05)
            current = sorted(self.grid.get_node_ids())
            if current != nodes:
                nodes, stable_since = current, time.monotonic()

    def round_done(self, done: int, total: int | None, converging: Convergence | None = None, capped: bool = False,
                   **headline: float | None) -> None:
        """The strategy's round ``done`` of ``total`` is over; ``headline``: the values that say how
        it went (``inertia=...``, ``loss=...``; None: not known, e.g. under DP; their meaning in
        :data:`fedgraphcore.progress.FIGURES`). ``total`` is an upper bound with ``capped``, or with
        ``converging``: the measure the strategy stops on, from which the progress line shows the
        rounds the run is expected to take; None: no bound worth showing."""
        self.progress.round(done, total, self.stats.bytes_up + self.stats.bytes_down, converging, capped, **headline)

    @property
    def node_ids(self) -> list[int]:
        """Ids of the clients still taking part, ordered by partition id."""
        return [c.node_id for c in self.clients if c.node_id not in self.dropped]

    def partition_of(self, node_id: int) -> int:
        return self._order[node_id]

    def take_back(self) -> list[int]:
        """Clients dropped because their SuperNode left or stopped answering, whose node has been
        missing from the federation since and is connected again (a restarted SuperNode keeps
        its node id): each is sent its ``hello`` again and, when its reply equals the one it
        gave at the start (partition, shard counts and figures), takes part again from the next
        step, recorded in :attr:`rejoined`. For steps a client with no state kept from earlier
        steps can answer (e.g. a FedAvg round, which sends the global model). Returns their
        node ids, in partition order."""
        unreachable = {n for n, d in self.dropped.items() if d["reason"].startswith((NO_REPLY, LEFT))}
        if not unreachable:
            return []
        online = set(self.grid.get_node_ids())
        self._seen_gone |= {n for n in unreachable if self.dropped[n]["reason"].startswith(LEFT)} | (unreachable - online)
        back = sorted(unreachable & self._seen_gone & online, key=self.partition_of)
        if not back:
            return []
        contents, spec = self._hello_sent
        replies = self.exchange(HELLO, {n: contents[n] for n in back}, spec, require_all=False, record=False)
        first = {c.node_id: c.summary for c in self.clients}
        taken = []
        for node, content in replies.items():
            _, values = unpack(content)
            values.pop("public_key", None)
            values.pop(KEY_ENDORSEMENT, None)
            if values != first[node]:
                changed = sorted(k for k in set(values) | set(first[node]) if values.get(k) != first[node].get(k))
                self.dropped[node]["reason"] = f"came back with a different shard ({', '.join(changed)} changed)"
                continue
            left = self.dropped.pop(node)
            self._seen_gone.discard(node)
            self.rejoined.append({"node": node, "client": self.partition_of(node), "left_round": left["round"],
                                  "round": self._round})
            taken.append(node)
        return taken

    # -- messaging ------------------------------------------------------------
    def exchange(
        self,
        action: str,
        contents: Mapping[int, RecordDict],
        expect: ReplySpec | Mapping[int, ReplySpec] | None = None,
        *,
        category: str = "query",
        require_all: bool = True,
        record: bool = True,
    ) -> dict[int, RecordDict]:
        """Send ``contents[node]`` to each node as ``<category>.<action>``; the checked replies.

        What goes over the wire: each node's content (:func:`fedgraphcore.transport.pack`), down; its
        reply, up, checked against ``expect`` before anything reads it. A client that did not
        answer within ``timeout`` is asked again up to ``retries`` times (a client refuses to mask
        twice under one secure-aggregation tag, so such a step fails rather than repeats); a
        message its SuperNode could not receive is sent again at once. A resumed run's step that
        its journal holds is not sent: its recorded replies are checked and returned.

        Parameters
        ----------
        action : str
            The step's name (:mod:`fedgraphcore.wire`), which the client dispatches on.
        contents : mapping of int to RecordDict
            What each node (by Flower node id) is sent.
        expect : ReplySpec or mapping of int to ReplySpec, optional
            What a valid reply holds (names, shapes, dtypes, finite values), for every node
            or per node; None: any reply.
        category : str
            The message type's prefix (``query``, or ``train`` for training steps).
        require_all : bool
            Any rejected reply stops the run. Else (a strategy that can go on with fewer
            clients) a rejected client is dropped (``dropped``, in result.json; :meth:`take_back`
            re-admits one whose SuperNode left and came back), and the run stops only when
            fewer than ``min-clients`` remain.
        record : bool
            Put the uploads in the privacy ledger (refused ones flagged ``rejected``).

        Returns
        -------
        dict of int to RecordDict
            The valid replies keyed by node id, in partition order (results do not depend on
            arrival order).

        Raises
        ------
        fedgraphcore.wire.ProtocolError
            A reply was rejected with ``require_all``, or too few clients remain; one line
            naming the clients and why. :class:`PrivacyRefused` when a node's privacy policy
            refused the step.
        """
        self._round += 1
        self.progress.step(action)
        sent_at = time.time()
        step = self.journal.step(self, action, category, contents, expect) if self.journal else None
        result = step.replay if step and step.replay else self._relay_and_send(action, category, contents, expect)
        self.stats.rounds.append(
            {
                "action": action,
                "sent_at": sent_at,
                "seconds": result.seconds,
                "bytes_up": result.bytes_up,
                "bytes_down": result.bytes_down,
                "replies": len(result.replies),
                **self._client_times(),
            }
        )
        self._settle_rejects(action, result.rejected, require_all, result.refusals)
        replies = dict(sorted(result.replies.items(), key=lambda item: self._order.get(item[0], item[0])))
        if record:
            self._record_uploads(action, replies.items(), expect)
            self._record_uploads(action, result.refused, expect, rejected=True)
        if step:
            step.done(replies, result.rejected)
        return replies

    def _relay_and_send(self, action, category, contents, expect) -> Exchange:
        """Send the step (a resumed run's replayed step is not: :mod:`fedgraphcore.journal`), the peers'
        public keys relayed with it when they are due."""
        if self._peer_keys and set(self.node_ids) <= set(contents):  # the relay reaches every client at once
            contents, self._peer_keys = _with_values(contents, self._peer_keys), {}
        return self._send_with_retries(action, category, contents, expect)

    def _send_with_retries(self, action, category, contents, expect) -> Exchange:
        """One exchange; a client whose SuperNode did not receive its message (reject
        :data:`~fedgraphcore.transport.NOT_RECEIVED`: its ClientApp never ran) is sent it again, up to
        :data:`~fedgraphcore.transport.NOT_RECEIVED_RESENDS` times, and the clients that did not answer within
        ``timeout`` are asked again up to ``retries`` times: every reply, reject and refused reply,
        and the summed seconds and bytes."""
        result = self._send(action, category, contents, expect)
        retries, resends = self.retries, NOT_RECEIVED_RESENDS
        while True:
            silent = {n for n, r in result.rejected.items() if retries and r.startswith(NO_REPLY)}
            lost = {n for n, r in result.rejected.items() if resends and r.startswith(NOT_RECEIVED)}
            if not silent | lost:
                return result
            retries, resends = retries - bool(silent), resends - bool(lost)
            again = self._send(action, category, {n: contents[n] for n in silent | lost}, expect)
            result.seconds += again.seconds
            result.bytes_up += again.bytes_up
            result.bytes_down += again.bytes_down
            result.replies.update(again.replies)
            result.rejected = {n: r for n, r in result.rejected.items() if n not in silent | lost}
            result.rejected.update(again.rejected)
            result.refused += again.refused
            result.refusals.update(again.refusals)

    def _settle_rejects(self, action: str, rejected: Mapping[int, str], require_all: bool,
                        refusals: Mapping[int, str]) -> None:
        """Record the rejected clients; stop the run on a privacy refusal (``refusals``: node ->
        rule), on any reject with ``require_all``, or when fewer than ``min-clients`` remain; else
        drop them for the rest of the run."""
        for node, reason in sorted(rejected.items()):
            self.rejects.append({"round": self._round, "action": action, "node": node, "reason": reason})
        self._stop_on_refusals(action, refusals)
        if not rejected:
            return
        detail = self._rejects_in_words(rejected)
        if require_all:
            raise ProtocolError(f"step '{action}' rejected {len(rejected)} client(s): {detail}")
        for node, reason in rejected.items():
            self.dropped[node] = {"round": self._round, "action": action, "reason": reason,
                                  "client": self._order.get(node)}
        remaining = len(self.node_ids)
        if remaining < self.min_clients:
            raise ProtocolError(
                f"step '{action}': {remaining} client(s) left, below min-clients={self.min_clients} ({detail})"
            )

    def _rejects_in_words(self, rejected: Mapping[int, str]) -> str:
        """The rejected clients and why, one reason said once where every client gave it."""
        reasons = set(rejected.values())
        if len(rejected) > 1 and len(reasons) == 1:  # e.g. a setting every client refuses: say it once
            return f"nodes {', '.join(map(str, sorted(rejected)))} all: {reasons.pop()}"
        return "; ".join(f"{self._who(n)}: {r}" for n, r in sorted(rejected.items()))

    def _stop_on_refusals(self, action: str, refusals: Mapping[int, str]) -> None:
        """Raise :class:`PrivacyRefused` naming every client that refused the step under its node's
        privacy policy (its refusal reply, :func:`fedgraphcore.transport.refusal`) and the rule (a refusal
        is a decision, not a dropout: the run stops)."""
        if not refusals:
            return
        by_partition = {self._order.get(n, -1): (rule, "") for n, rule in refusals.items()}
        detail = "; ".join(f"{self._who(n)}, rule '{rule}'" for n, rule in sorted(refusals.items()))
        raise PrivacyRefused(action, by_partition, detail)

    def _client_times(self) -> dict:
        """The clients' share of the round, where the grid measures it (the
        in-process grid, whose nodes run one after another): their summed
        seconds and the slowest one's, i.e. the round's client time with the
        nodes side by side. Empty on an engine that runs nodes concurrently."""
        take = getattr(self.grid, "take_client_seconds", None)
        if take is None:
            return {}
        seconds = take()
        return {"client_sum_s": sum(seconds), "client_max_s": max(seconds, default=0.0)}

    def _send(self, action, category, contents, expect):
        messages = [
            Message(content, dst_node_id=node, message_type=f"{category}.{action}",
                    group_id=str(self._round), ttl=self.timeout + 60)
            for node, content in contents.items()
        ]
        return exchange(self.grid, messages, expect, self.timeout, self.stats, self.shared.transport)

    def broadcast(
        self,
        action: str,
        content: RecordDict,
        expect: ReplySpec | Mapping[int, ReplySpec] | None = None,
        **kwargs,
    ) -> dict[int, RecordDict]:
        """Send the same content to every client (see :meth:`exchange`)."""
        return self.exchange(action, {n: content for n in self.node_ids}, expect, **kwargs)

    def _record_uploads(self, action, replies, expect, rejected: bool = False) -> None:
        """Ledger rows for every array and value of ``replies`` ((node, content) pairs);
        ``rejected``: replies the server refused, which left the client all the same (recorded
        unmasked and un-noised, since the server cannot vouch for either)."""
        for node, content in replies:
            spec = expect.get(node) if isinstance(expect, Mapping) else expect
            client = self.partition_of(node)
            try:
                arrays, values = describe(content)
            except Exception:  # a reply malformed beyond reading: its bytes are counted, its names unknown
                self.ledger.add_upload(action, client, "<unreadable reply>", (), "unknown", rejected=True)
                continue
            for name, (shape, dtype) in arrays.items():
                aspec = spec.arrays.get(name, ArraySpec()) if spec and not rejected else ArraySpec()
                self.ledger.add_upload(action, client, name, shape, dtype,
                                       masked=aspec.masked, noised=aspec.noised, rejected=rejected)
            for name, value in values.items():
                shape = (len(value),) if isinstance(value, list) else ()
                self.ledger.add_upload(action, client, name, shape, type(value).__name__, rejected=rejected)

    def _who(self, node: int) -> str:
        """'client 2 (node 1003)', or 'node 1003' before hello has told its partition."""
        return f"client {self._order[node]} (node {node})" if node in self._order else f"node {node}"
