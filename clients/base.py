"""Base class of every method's client side.

The ClientApp builds one client object per message and calls
:meth:`ClusteringClient.handle`; the client answers the protocol step named by
the message's action with the method marked ``@answers(ACTION)`` (the action
names are constants of the method's protocol module). Anything a client must remember between steps goes into
``context.state`` (Flower keeps it per node for the whole run) via
:meth:`save` / :meth:`load`. A deployed SuperNode sends that state to the
ClientApp process of every message and takes it back with the reply, so what
the client can compute again from its shard (filtered features) is not kept
there but once per process.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from contextlib import contextmanager
from functools import cached_property
from typing import Callable, ClassVar, Generic

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from fedgraphcore.config import ConfigError, ConfigView, NoConfig, NoiseConfig, RunConfig, SecAggConfig, SharedConfig, ViewT
from fedgraphcore.data import parties
from fedgraphcore.party_outputs import write_party_labels
from fedgraphcore.data.memory import is_memory
from fedgraphcore.data.types import Shard
from fedgraphcore.privacy.budget import NodeLedger, composed_epsilon
from fedgraphcore.privacy.roster import (CONSISTENCY_RULE, IDENTITY_KEY, ROSTER_KEY, check_consistency, check_endorsed,
                                consistency_statement, endorse, key_statement, load_identity, load_roster, public_bytes)
from fedgraphcore.privacy.policy import PrivacyRefusal, StrategyPolicy, node_policy
from fedgraphcore.privacy.releases import ReleaseRecord, dataset_key, record_dir
from fedgraphcore.privacy.secagg import FixedPointEncoder, SecAggParty, unpack_id_bytes
from fedgraphcore.privacy.secagg_recovery import (RecoveryRefused, inbox_shares, mask_recoverable, sealed_rows, told_split,
                                         unmask_response)
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ProtocolError
from fedgraphcore.wire import HELLO, KEY_ENDORSEMENT, LABELS, SECAGG_AGREE, SECAGG_PEER, SECAGG_SESSION, SECAGG_SETUP
from fedgraphcore.wire import SECAGG_INBOX, SECAGG_PARTICIPANTS, SECAGG_SHARES, SECAGG_THRESHOLD, SECAGG_UNMASK
from fedgraphcore.wire import SECAGG_CONSISTENCY, SECAGG_ENDORSED, SECAGG_SIGNED, SURVIVOR_SIGNATURE
from clients.steps import StepGuard

Reply = tuple[dict, dict]  # (arrays, values) of a reply
#: ``context.state`` record of how many noise draws this node made per action (``privacy.noise-seed``)
NOISE_DRAWS = "noise-draws"
#: the state record of the peers' identity keys (party order), kept by a node with a roster
MEMBERS_RECORD = "secagg-members"


def holds_own_data(node_config) -> bool:
    """Whether a node brings its own data (a shard file, or a party's data on disk): a deployed
    member, whose noise never derives from anything the server sends. A simulated node builds its
    partition of the run's dataset; an in-process party's piece lives in the caller's process."""
    data = str(node_config.get(parties.DATA_KEY) or "")
    return bool(node_config.get("shard")) or (bool(data) and not is_memory(data))


def answers(action: str, *, train: bool = False) -> Callable:
    """Mark a client method ``(self, arrays, values) -> (arrays, values)`` as the answer to protocol
    step ``action``; ``train``: sent as Flower's ``train`` message type (weight training), else ``query``."""
    def mark(method: Callable) -> Callable:
        method.answers = (action, train)
        return method
    return mark


class ClusteringClient(Generic[ViewT]):
    """Client side of one method. Subclasses mark one method ``@answers(ACTION)`` per step.

    ``self.cfg`` is the method's own keys as its typed ``settings`` view (the class its
    strategy reads too), ``self.shared`` the keys every method shares."""

    settings: ClassVar[type[ConfigView]] = NoConfig
    _steps: ClassVar[dict[str, tuple[str, bool]]]

    def __init__(self, shard: Shard, config: RunConfig, context: Context) -> None:
        self.shard = shard
        self.config = config
        self.context = context
        self.cfg: ViewT = self.settings.of(config)
        self.shared = SharedConfig.of(config)
        self.secagg = SecAggConfig.of(config)
        self.noise_seed = NoiseConfig.of(config).noise_seed

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._steps = _marked_steps(cls)

    @classmethod
    def steps(cls) -> dict[str, tuple[str, bool]]:
        """Every protocol step this client answers: action -> (method name, sent as ``train``), as
        marked when the class was defined (a method replaced later answers under the same name)."""
        return dict(cls._steps)

    def handle(self, action: str, content: RecordDict) -> RecordDict:
        """Answer protocol step ``action`` (its ``@answers`` method).

        Parameters
        ----------
        action : str
            The step (the message type without its category), one of :meth:`steps`.
        content : RecordDict
            The server's request (:func:`fedgraphcore.transport.pack`): arrays and values, with the
            peers' relayed public keys where the run is secure.

        Returns
        -------
        RecordDict
            The reply that goes back over the wire: what the step's method returns, masked or
            noised where the step says so, with the sealed shares of a recoverable masked sum.

        Raises
        ------
        fedgraphcore.privacy.policy.PrivacyRefusal
            This node's privacy policy forbids the step, or sets a rule the strategy cannot meet
            (every step refused); the ClientApp answers with a refusal naming the rule.
        """
        self.policy.refuse_unmet()
        self._refuse_seeded_noise()
        arrays, values = unpack(content)
        relayed = {k[len(SECAGG_PEER):]: v for k, v in values.items() if k.startswith(SECAGG_PEER)}
        endorsed = {k: v for k, v in values.items() if k.startswith(SECAGG_ENDORSED)}
        values = {k: v for k, v in values.items() if not k.startswith((SECAGG_PEER, SECAGG_ENDORSED))}
        digest = request_digest(arrays, values)
        self._handled = (arrays, values, digest)  # hashed once: a large block costs a pass over its bytes
        kept = self.steps_answered.kept(action, digest)
        if isinstance(kept, RecordDict):  # the same request again (a retry): the first reply, no second release
            return kept
        fresh = kept is None  # else its method hands back the reply it kept
        if fresh:
            self.steps_answered.check(action, digest, values)
        if relayed and fresh:  # the peers' keys ride on the first step after hello: agree on the seeds first
            self._agree({**relayed, **endorsed}, HELLO)
        method, _ = self._steps[action]
        reply_arrays, reply_values = getattr(self, method)(arrays, values)
        if SECAGG_THRESHOLD in values:  # a recoverable masked upload: its sealed shares go with it
            reply_arrays = {**reply_arrays, **self._sealed_shares(str(values.get("secagg_tag")))}
        reply = pack(reply_arrays, reply_values)
        if fresh:
            self.steps_answered.answered(action, digest, values, reply)
        return reply

    # -- the protocol's order and count (clients.steps) ------------------------
    @cached_property
    def steps_answered(self) -> StepGuard:
        """This run's steps answered so far: each step in the protocol's order and count, a request
        sent again answered with its first reply (:class:`clients.steps.StepGuard`)."""
        return StepGuard(self)

    @cached_property
    def release_record(self) -> ReleaseRecord:
        """This node's release record of the rows it holds (:mod:`fedgraphcore.privacy.releases`)."""
        s = self.shard
        cols = () if s.feature_cols is None else tuple(np.asarray(s.feature_cols).tolist())
        shape = (s.num_nodes, s.num_graphs, *np.shape(s.x if s.x is not None else ()))
        key = dataset_key(f"{s.dataset}|{s.partitioner}|{cols}", s.item_keys if s.graph_ids is None
                          else s.graph_ids, shape)
        return ReleaseRecord(record_dir(self.policy.ledger), self.context.state, key)

    def step_limits(self) -> dict[str, int]:
        """The most times each step may be answered in one run, from this client's own view of the
        run (its run config): the protocol's count. A step not named here has no count of its own
        (each of its requests is still answered once). Every method: hello and the final labels once."""
        return {HELLO: 1, LABELS: 1}

    def label_classes(self, action: str, values) -> int:
        """The classes of a reply of ``action`` that labels this node's rows (0: not a label reply;
        :attr:`label_steps`), recorded as a label release of the dataset."""
        return int(self.shared.num_clusters) if action in self.label_steps else 0

    #: the steps whose reply labels this node's rows (a label release: log2(classes) bits a row)
    label_steps: ClassVar[tuple[str, ...]] = ()

    # -- steps every method shares -------------------------------------------
    @answers(HELLO)
    def on_hello(self, arrays, values) -> Reply:
        """Say which partition this node holds and its size (counts only): rows, graphs, local
        edges and rows without a local edge, so that the server can tell a split the method
        cannot use before the first step; and which cut of the data a shard file comes from
        (its ``shard_cut``: seed, data hash and split parameters of ``python -m app.data.prepare``;
        empty for a shard cut in this process), so that shards of different cuts are refused at
        once. A party with its own data (``dataset = 'parties'``), where every party must hold
        the same nodes (edge, vertical), also sends the digest of its ordered node IDs
        (:func:`fedgraphcore.data.parties.node_set_digest`), never the IDs."""
        s = self.shard
        summary = {
            "partition_id": s.client_id,
            "num_partitions": s.num_clients,
            "dataset": s.dataset,
            "partitioner": s.partitioner,
            "num_rows": int(len(s.node_ids)) if s.node_ids is not None else 0,
            "num_graphs": s.num_graphs,
            "num_edges": s.num_edges,
            "num_isolated": s.num_isolated,
            "shard_cut": s.cut,
        }
        if s.dataset == parties.PARTIES:
            if parties.family(s.partitioner) in parties.SHARED_NODES:
                summary["node_digest"] = parties.node_set_digest(s.keys)
        summary.update(self.hello_figures(values))
        if SECAGG_SESSION in values:  # a secure run: this party's key pair now, saving a round
            self.policy.check_group(s.num_clients)
            summary.update(self.on_secagg_setup({}, {"session_id": values[SECAGG_SESSION]}, step=HELLO)[1])
        return self.hello_arrays(values), summary

    def hello_figures(self, values) -> dict:
        """The method's own figures for the hello reply (the numbers of its strategy's ``hello_reply``), from the
        hello request's ``values`` (its strategy's ``hello_values``); none by default."""
        return {}

    def hello_arrays(self, values) -> dict[str, np.ndarray]:
        """The method's own arrays for the hello reply (the arrays of its strategy's ``hello_reply``), from the
        hello request's ``values``; none by default."""
        return {}

    @answers(LABELS)
    def on_labels(self, arrays, values) -> Reply:
        """Receive the final cluster labels of this client's items (in its row order) and keep
        them; a party with its own data also writes them with its own IDs to labels.csv in
        ``<out-dir>/run-<run id>/`` of its node config (never over another run's)."""
        labels = arrays["labels"]
        self.save("labels", labels=labels)
        s = self.shard
        if s.dataset == parties.PARTIES:
            item = "graph" if parties.family(s.partitioner) == "graphs" else "node"
            out = self.context.node_config.get(parties.OUT_KEY)
            if out:
                write_party_labels(str(out), self.context.run_id, s.keys, labels, item)
        return {}, {"received": int(labels.size)}

    # -- privacy noise -------------------------------------------------------
    def noise(self, action: str) -> np.random.Generator:
        """The generator of one draw of this node's privacy noise for ``action`` (call it once per
        release): fresh OS entropy; with ``privacy.noise-seed`` (a simulated or in-process node only,
        :meth:`_refuse_seeded_noise`) a stream seeded by it, this partition, the action and how
        many draws of it this node made, so that the run repeats byte for byte."""
        if self.noise_seed < 0:
            return np.random.default_rng()
        drawn = self.context.state.config_records.get(NOISE_DRAWS, ConfigRecord())
        count = int(drawn.get(action, 0))
        drawn[action] = count + 1
        self.context.state[NOISE_DRAWS] = drawn
        return np.random.default_rng([self.noise_seed, self.shard.client_id, zlib.crc32(action.encode()), count])

    def _refuse_seeded_noise(self) -> None:
        """A node with its own data refuses every step of a run that names a noise seed: the server,
        which sends the run-config, must not know (or choose) the noise that protects the data."""
        if self.noise_seed >= 0 and holds_own_data(self.context.node_config):
            raise PrivacyRefusal("noise-seed", f"privacy.noise-seed={self.noise_seed}: this node holds its own data "
                                               "and draws its privacy noise from OS entropy only; valid: a run "
                                               "without privacy.noise-seed (simulation and in-process runs only)")

    # -- this node's privacy policy (fedgraphcore.privacy.policy) ----------------------
    @cached_property
    def policy(self) -> StrategyPolicy:
        """This node's rules for the run's strategy, from its node config (never the run's)."""
        return node_policy(self.context.node_config).for_strategy(self.shared.strategy)

    def require_masking(self, action: str, values, needed_by_run: bool) -> None:
        """Refuse an upload requested without masking that this node's policy, or its own
        view of the run (``needed_by_run``), requires masked."""
        self.policy.require_masking(action, values, needed_by_run)

    def masking_groups(self, parties: int) -> list[set[int]]:
        """The masking groups the protocol defines among ``parties`` clients (default: all of them)."""
        return [set(range(parties))]

    # -- secure aggregation (see fedgraphcore.privacy.secagg) -------------------------
    @answers(SECAGG_SETUP)
    def on_secagg_setup(self, arrays, values, step: str = SECAGG_SETUP) -> Reply:
        """Create this party's X25519 key pair; upload the public key and, on a node with an
        identity key, the key's endorsement for ``step`` (:mod:`fedgraphcore.privacy.roster`; else empty)."""
        session = str(values["session_id"])
        party = SecAggParty.generate(self.shard.client_id, session)
        self._save_party(party)
        key = party.public_key_bytes()
        identity = self.membership[0]
        statement = key_statement(self.context.run_id, session, step, party.party_id, self.shard.num_clients, key)
        return {}, {"public_key": key, KEY_ENDORSEMENT: b"" if identity is None else endorse(identity, statement)}

    @answers(SECAGG_AGREE)
    def on_secagg_agree(self, arrays, values) -> Reply:
        """Derive the pairwise mask seeds from the relayed public keys: those of every
        other client of the run (``num_partitions`` of the shard), no fewer; on a node with a
        roster, each endorsed by a different member (:mod:`fedgraphcore.privacy.roster`)."""
        return self._agree(values, SECAGG_SETUP)

    def _agree(self, values, step: str) -> Reply:
        party = self._load_party()
        keys = unpack_id_bytes({k: v for k, v in values.items() if not k.startswith(SECAGG_ENDORSED)})
        everyone = set(range(self.shard.num_clients))
        if set(keys) != everyone:
            raise PrivacyRefusal("masking-group", f"keys relayed for parties {sorted(keys)}; this client masks only "
                                                  f"with every client of the run, {sorted(everyone)}")
        self._check_endorsed(party, keys, values, step)
        self.policy.check_group(len(everyone))
        party.agree(keys)
        self._save_party(party)
        return {}, {"peers": len(party.peers)}

    # -- the member roster (fedgraphcore.privacy.roster) -------------------------------
    @cached_property
    def membership(self) -> tuple:
        """(identity key, roster) of this node (its node config's ``identity-key`` and ``roster``),
        each None where it sets none; a roster needs the identity key, which must be in it."""
        config = self.context.node_config
        identity = load_identity(str(config[IDENTITY_KEY])) if config.get(IDENTITY_KEY) else None
        roster = load_roster(str(config[ROSTER_KEY])) if config.get(ROSTER_KEY) else None
        if roster is not None and (identity is None or roster.name_of(public_bytes(identity)) is None):
            raise ConfigError(f"node config '{ROSTER_KEY}' without this node's own '{IDENTITY_KEY}' in it",
                              public=f"node config '{ROSTER_KEY}', rule 'lists this node's identity key'")
        return identity, roster

    def _check_endorsed(self, party: SecAggParty, keys: dict, values, step: str) -> None:
        """On a node with a roster: every relayed key endorsed by a different roster member for this
        run, session, step, party and parties (else refused, rule ``roster``); the identities kept for
        the consistency round."""
        identity, roster = self.membership
        if roster is None:
            return
        session, parties = party.session_id.decode(), self.shard.num_clients
        statements = {p: key_statement(self.context.run_id, session, step, p, parties, key)
                      for p, key in keys.items()}
        endorsements = {int(k[len(SECAGG_ENDORSED):]): v for k, v in values.items() if k.startswith(SECAGG_ENDORSED)}
        found = check_endorsed(roster, party.party_id, public_bytes(identity), endorsements, statements)
        self.save(MEMBERS_RECORD, identities=np.stack([np.frombuffer(found[p], dtype=np.uint8)
                                                       for p in range(parties)]))

    @answers(SECAGG_CONSISTENCY)
    def on_secagg_consistency(self, arrays, values) -> Reply:
        """The consistency round of a recoverable sum: this party's signature over the survivors and
        dropped parties it is told (empty without an identity key); one split per tag."""
        party = self._load_party()
        tag = str(values["secagg_tag"])
        split = self._told(party, tag, values)
        held = party.recovery[tag]
        if held.setdefault("signed", split) != split:
            raise PrivacyRefusal(CONSISTENCY_RULE, f"tag {tag!r}: asked to sign a second survivor set")
        self._save_party(party)
        identity = self.membership[0]
        statement = consistency_statement(self.context.run_id, party.session_id.decode(), tag, *split)
        return {}, {SURVIVOR_SIGNATURE: b"" if identity is None else identity.sign(statement)}

    @staticmethod
    def _told(party: SecAggParty, tag: str, values) -> list[list[int]]:
        """The split a consistency or unmask request names, once this party may answer it."""
        try:
            return told_split(party, tag, values["secagg_survivors"], values["secagg_dropped"])
        except RecoveryRefused as err:  # a request this party must not answer: the run stops on it
            raise PrivacyRefusal("secagg-unmask", str(err)) from None

    def _check_consistency(self, party: SecAggParty, tag: str, split: list[list[int]], values) -> None:
        """On a node with a roster: the split it signed, signed by every survivor (else refused,
        rule ``secagg-consistency``), before any share leaves it."""
        if self.membership[1] is None:
            return
        if party.recovery[tag].get("signed") != split:
            raise PrivacyRefusal(CONSISTENCY_RULE, f"tag {tag!r}: an unmask request for a survivor set this party "
                                                   "did not sign")
        identities = {p: row.tobytes() for p, row in enumerate(self.load(MEMBERS_RECORD)["identities"])}
        signatures = {int(k[len(SECAGG_SIGNED):]): v for k, v in values.items() if k.startswith(SECAGG_SIGNED)}
        statement = consistency_statement(self.context.run_id, party.session_id.decode(), tag, *split)
        check_consistency(identities, split[0], signatures, statement)

    def masked(self, array: np.ndarray, values, participants=None, floor: float | None = None) -> np.ndarray:
        """``array`` clipped to the declared bound, fixed-point encoded and pairwise masked
        (uint32 / uint64 ring) for a secure sum.

        ``values`` are the message values from ``ServerSession.secagg_values``;
        ``participants`` (partition ids) restricts the masks to a sub-group's sum, one
        of :meth:`masking_groups` only (default: every client). A group this node's
        ``min-group`` does not allow, and a declared bound below ``floor`` (default:
        the run's ``secagg.bound``; what the honest server declares), are refused
        whatever the array holds. Values beyond the bound are clipped to it, never
        refused: a refusal that depended on the values would tell the server, which
        chose the bound, whether one exceeds it (a bisection of the bound reads them).
        """
        group = self._masking_group(participants)
        self.policy.check_group(len(group))
        bound = float(values["secagg_bound"])
        floor = self.secagg.bound if floor is None else float(floor)
        if not bound >= floor * (1 - 1e-12):
            raise PrivacyRefusal("secagg-bound", f"secagg_bound={bound:.6g} for '{values['secagg_tag']}', below "
                                                 f"{floor:.6g}, the bound this step declares honestly")
        encoder = FixedPointEncoder(values["secagg_scale"], bound, values["secagg_parties"])
        party = self._load_party()
        clipped = np.clip(np.asarray(array, dtype=np.float64), -bound, bound)
        if SECAGG_THRESHOLD in values:
            return self._masked_recoverable(party, clipped, values, encoder)
        out = party.mask(clipped, str(values["secagg_tag"]), encoder,
                         participants=None if participants is None else sorted(group))
        self._save_party(party)  # the party remembers used tags
        return out

    def _masked_recoverable(self, party: SecAggParty, clipped: np.ndarray, values,
                            encoder: FixedPointEncoder) -> np.ndarray:
        """A masked upload that survives dropouts (fedgraphcore.privacy.secagg_recovery), among the parties
        the request names (this node's ``min-group`` checked on their number): its sealed shares
        go with the reply (``secagg_shares``)."""
        group = {int(p) for p in values[SECAGG_PARTICIPANTS]}
        everyone = set(range(self.shard.num_clients))
        if self.shard.client_id not in group or not group <= everyone:
            raise PrivacyRefusal("masking-group", f"participants {sorted(group)} of '{values['secagg_tag']}'; "
                                                  f"valid: this client and others of {sorted(everyone)}")
        self.policy.check_group(len(group))
        out, sealed = mask_recoverable(party, clipped, str(values["secagg_tag"]), encoder,
                                             int(values[SECAGG_THRESHOLD]), participants=sorted(group))
        self._save_party(party)  # the party remembers used tags and its share of its self mask
        tag = np.frombuffer(str(values["secagg_tag"]).encode(), dtype=np.uint8)
        self.save(SECAGG_SHARES, rows=sealed_rows(sealed, len(everyone)), tag=tag)
        return out

    def _sealed_shares(self, tag: str) -> dict[str, np.ndarray]:
        """The sealed shares of this party's recoverable upload of ``tag`` (kept, so that a reply
        kept for a request sent again goes with them too), as reply arrays; none without one."""
        if SECAGG_SHARES not in self.context.state.array_records:
            return {}
        kept = self.load(SECAGG_SHARES)
        return {SECAGG_SHARES: kept["rows"]} if kept["tag"].tobytes() == tag.encode() else {}

    @answers(SECAGG_UNMASK)
    def on_secagg_unmask(self, arrays, values) -> Reply:
        """A recoverable sum's unmask round: this party's shares of the survivors' self-mask seeds
        (opened from the ``secagg_inbox`` rows sealed for it) and its pair masks with the dropped
        parties; never both for one party of a tag (:func:`fedgraphcore.privacy.secagg_recovery.unmask_response`)."""
        party = self._load_party()
        tag = str(values["secagg_tag"])
        survivors, dropped = self._told(party, tag, values)
        self._check_consistency(party, tag, [survivors, dropped], values)
        encoder = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
        size = int(values["secagg_size"]) if dropped else 0
        try:
            shares, correction = unmask_response(
                party, tag, survivors, dropped, inbox_shares(arrays[SECAGG_INBOX], survivors, party.party_id), size,
                encoder)
        except RecoveryRefused as err:  # a request this party must not answer: the run stops on it
            raise PrivacyRefusal("secagg-unmask", str(err)) from None
        self._save_party(party)  # the split answered for the tag
        rows = np.stack([np.frombuffer(shares[u], dtype=np.uint8) for u in survivors])
        return {"self_shares": rows, "correction": correction}, {}

    def _masking_group(self, participants) -> set[int]:
        everyone = set(range(self.shard.num_clients))
        if participants is None:
            return everyone
        group = {int(p) for p in participants}
        if group not in self.masking_groups(len(everyone)):
            raise PrivacyRefusal("masking-group", f"masking group {sorted(group)} is not one of the protocol's "
                                                  f"groups {[sorted(g) for g in self.masking_groups(len(everyone))]}")
        return group

    def _save_party(self, party: SecAggParty) -> None:
        self.context.state["secagg"] = ArrayRecord({"party": Array(party.to_array())})

    def _load_party(self) -> SecAggParty:
        return SecAggParty.from_array(self._kept("secagg")["party"].numpy())

    # -- state between steps --------------------------------------------------
    def save(self, record: str, **arrays: np.ndarray) -> None:
        """Keep ``arrays`` in ``context.state[record]`` (replacing it)."""
        self.context.state[record] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})

    def load(self, record: str) -> dict[str, np.ndarray]:
        """Arrays saved by :meth:`save`; :class:`ProtocolError` when the step that keeps them has not
        run (a server that skipped or reordered steps)."""
        return {k: v.numpy() for k, v in self._kept(record).items()}

    def _kept(self, record: str) -> ArrayRecord:
        if record not in self.context.state.array_records:
            raise ProtocolError(f"a step that needs '{record}' came before the step that keeps it")
        return self.context.state.array_records[record]

    def released_once(self, action: str, arrays, values, compute) -> tuple[dict, dict]:
        """The reply to a request whose answer carries fresh privacy noise, computed once:
        the same request sent again (its reply timed out and ``retries`` > 0) gets the
        kept reply back, so a retry is no second draw for the server to average and the
        accountant's count of releases stays exact. ``compute()`` returns the reply's
        arrays (a noised reply carries no values). The server makes every release's
        request differ (its round), so only a re-sent request matches."""
        digest = self.digest(arrays, values)
        kept = self._kept_reply(action, digest)
        if kept is not None:
            return kept, {}
        reply = compute()
        self.save(f"released:{action}", request=digest, **reply)
        return reply, {}

    def digest(self, arrays, values) -> np.ndarray:
        """:func:`request_digest` of the request being answered (computed once by :meth:`handle`)."""
        handled = getattr(self, "_handled", None)
        if handled is not None and handled[0] is arrays and handled[1] is values:
            return handled[2]
        return request_digest(arrays, values)

    def _kept_reply(self, action: str, digest: np.ndarray) -> dict | None:
        record = f"released:{action}"
        if record not in self.context.state.array_records:
            return None
        kept = self.load(record)
        return kept if np.array_equal(kept.pop("request"), digest) else None

    def ledger(self) -> NodeLedger:
        """This node's privacy ledger (on disk where its node config or data says)."""
        return NodeLedger(self.policy.ledger, self.context.state)

    def release(self, action: str, arrays, values, compute, *, multiplier: float | None,
                most: int | None = None) -> tuple[dict, dict]:
        """:meth:`released_once` under :meth:`spending`: recorded in this node's ledger,
        refused beyond its budget (a re-sent request gets its kept reply, no new release)."""
        digest = self.digest(arrays, values)
        kept = self._kept_reply(action, digest)
        if kept is not None:
            return kept, {}
        with self.spending(action, digest, multiplier, most):
            return self.released_once(action, arrays, values, compute)

    @contextmanager
    def spending(self, action: str, digest: np.ndarray, multiplier: float | None, most: int | None = None):
        """One release of ``action``, recorded in this node's ledger once the body (which
        computes it) has run. ``multiplier``: its noise std / L2 sensitivity (None:
        un-noised). Refused before the body runs: release ``most`` + 1 of ``action`` in this
        run (the run's own budget; counted in the ledger, so a restarted node continues the
        count), and a release that would take the strategy's epsilon over every run in the
        ledger (RDP composition at the policy's ``delta``) above the node's ``epsilon``."""
        strategy, run = self.shared.strategy, int(self.context.run_id)
        ledger = self.ledger()
        budget, delta = float(self.policy["epsilon"]), float(self.policy["delta"])
        with ledger.locked():
            # read only for a limit: a long run appends thousands of releases
            limited = most is not None or math.isfinite(budget)
            mine = [r for r in ledger.records() if r["strategy"] == strategy] if limited else []
            made = sum(r["run"] == run and r["action"] == action for r in mine)
            if most is not None and made >= most:
                raise PrivacyRefusal("releases", f"release {made + 1} of {action} in run {run}: this client's "
                                                 f"privacy budget for the run covers {most} (ledger {ledger.where()})")
            if math.isfinite(budget) and ledger.path is None:
                raise PrivacyRefusal("epsilon", f"this node's {strategy} epsilon={budget:g} needs a ledger file to "
                                                "count releases over runs; valid: node-config privacy-ledger, or a "
                                                "shard / data file to keep it beside")
            if math.isfinite(budget):
                spent = composed_epsilon([r["noise_multiplier"] for r in mine] + [multiplier], delta)
                if spent > budget * (1 + 1e-9):
                    kind = "un-noised" if multiplier is None else f"noise multiplier {multiplier:.4g}"
                    raise PrivacyRefusal("epsilon", f"{action} ({kind}) after {len(mine)} earlier release(s) would "
                                                    f"bring this node's {strategy} epsilon to {spent:.4g} at delta "
                                                    f"{delta:g}, above its budget {budget:g} (ledger {ledger.where()})")
            yield
            ledger.append(run, strategy, action, bytes(digest).hex(), multiplier)


def _marked_steps(cls: type) -> dict[str, tuple[str, bool]]:
    """The ``@answers`` methods of ``cls`` and its bases: action -> (method name, train)."""
    found = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            if hasattr(member, "answers"):
                action, train = member.answers
                found[action] = (name, train)
    return found


ClusteringClient._steps = _marked_steps(ClusteringClient)


def request_digest(arrays: dict, values: dict) -> np.ndarray:
    """SHA-256 of a request's arrays and values (equal only for the same request)."""
    digest = hashlib.sha256(repr(sorted(values.items())).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{a.dtype}:{a.shape}".encode())
        digest.update(a.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.uint8)
