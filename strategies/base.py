"""Base class of every clustering strategy (the server side of a method).

A strategy drives its whole protocol through a :class:`fedgraphcore.session.ServerSession`
(``session.broadcast`` / ``session.exchange``) and returns a
:class:`StrategyOutput`. It also names the centralised method a user would run
if the data could be pooled (:meth:`reference`), computed on the same data and
seed and reported beside the federated result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Generic, Mapping

import numpy as np

from fedgraphcore.config import ConfigError, ConfigView, NoConfig, Param, RunConfig, SecAggConfig, SharedConfig, ViewT
from fedgraphcore.data import memory
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.data.types import GraphCollection, GraphData
from fedgraphcore.wire import ProtocolError, ReplySpec

if TYPE_CHECKING:
    from fedgraphcore.session import HelloAsk, ServerSession


@dataclass
class StrategyOutput:
    """Result of a federated run.

    ``labels``: cluster labels of the items ``ids`` (global node ids, or graph
    ids for graph-level methods); ``ids`` None means ``labels[i]`` is item i.
    Items no client labelled are -1; an item labelled by several clients (node
    overlap) keeps the label of the first occurrence.
    ``truth``: ground truth for ``labels`` when the items are not the
    dataset's own nodes/graphs (e.g. centre-label pseudo-labels of k-hop
    subgraphs); then only label metrics are computed, against it.
    ``metrics``: extra method-specific figures (e.g. classification accuracy).
    ``history``: per-round records (for metric-vs-round plots).
    ``distances``: the pairwise distances between the items ``ids`` where the method computes
    them (gw-ldp's Gromov-Wasserstein matrix); the run's page draws the items by them.
    """

    labels: np.ndarray
    ids: np.ndarray | None = None
    truth: np.ndarray | None = None
    metrics: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    distances: np.ndarray | None = None

    def dense_labels(self, num_items: int) -> np.ndarray:
        """Labels indexed by item id, -1 where no client gave one; ids outside
        0..num_items-1 stop the run (a negative id would wrap to the end)."""
        if self.ids is None:
            return np.asarray(self.labels, dtype=np.int64)
        ids = np.asarray(self.ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise ProtocolError(f"item ids of dtype {ids.dtype}; valid: integers")
        if ids.shape != np.shape(self.labels):
            raise ProtocolError(f"{ids.size} item ids for {np.size(self.labels)} labels")
        if ids.size and (ids.min() < 0 or ids.max() >= num_items):
            raise ProtocolError(f"item ids in [{ids.min()}, {ids.max()}], outside 0..{num_items - 1}")
        out = np.full(num_items, -1, dtype=np.int64)
        ids, first = np.unique(ids, return_index=True)
        out[ids] = np.asarray(self.labels)[first]
        return out


#: Share of rows without a local edge above which a method that clusters each shard's own graph
#: (``local_graphs``) is warned about, and above which it stops: the clients' graphs are then
#: almost all isolated nodes (e.g. 100 clients sharing karate's 78 edges: 95%).
ISOLATED_WARN = 0.5
ISOLATED_STOP = 0.9


def _clients_hold(ids, most: int = 8) -> str:
    """'client 3 holds' / 'clients 3, 4, ... and N more hold': the first ``most`` partition ids."""
    ids = sorted(ids)
    listed = ", ".join(str(i) for i in ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")
    return f"client {listed} holds" if len(ids) == 1 else f"clients {listed} hold"


class ClusteringStrategy(ABC, Generic[ViewT]):
    """Server side of one method; subclasses set the class attributes. A subclass's docstring is
    the paragraph ``python -m app.run --strategy NAME --help`` prints about the method.

    ``self.cfg`` is the method's own keys as its typed ``settings`` view (shared with its client,
    declared in its protocol module), ``self.shared`` the keys every method shares and
    ``self.secagg`` secure aggregation's; ``self.config`` is the whole validated run-config.

    ``params`` are not written but derived: the keys of the ``settings`` view the class itself
    names (a subclass that inherits its parent's view declares no key; it lists those it reads
    as ``borrowed``)."""

    settings: ClassVar[type[ConfigView]] = NoConfig

    name: ClassVar[str]
    summary: ClassVar[str]
    split: ClassVar[str]  # what each client holds, in words
    params: ClassVar[tuple[Param, ...]] = ()  # the keys the strategy declares: its settings' (see above)
    borrowed: ClassVar[tuple[Param, ...]] = ()  # keys another strategy declares that this one reads too
    ignores: ClassVar[tuple[str, ...]] = ()  # shared keys (app.registry.core_params) the method does not read
    partitioners: ClassVar[tuple[str, ...]]  # first one is the default
    needs_edges: ClassVar[bool] = False  # the method uses the graph's edges
    needs_features: ClassVar[bool] = False  # the method uses node features
    #: Why the method cannot take edge weights (it counts every edge as 1), or "" when it uses them as
    #: they are (weighted degrees, filters, losses) or uses no edges.
    refuses_weights: ClassVar[str] = ""
    #: Each client clusters the graph of its own shard: its rows without a local edge carry no
    #: structure into the result (:meth:`check_shards`).
    local_graphs: ClassVar[bool] = False
    #: The method's secure sums still mean what they should over the clients that answered
    #: (per-client sums, averages): such a sum goes on without a client that drops
    #: (:meth:`fedgraphcore.session.ServerSession.recovers`). Sums that need every party's rows (whole-graph
    #: modes, padded sums) never do, whatever this says.
    tolerates_dropouts: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "params" in vars(cls):
            raise TypeError(f"{cls.__name__} writes params; declare its keys as fields of its settings view")
        cls.params = cls.settings.params() if "settings" in vars(cls) else ()

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.cfg: ViewT = self.settings.of(config)
        self.shared = SharedConfig.of(config)
        self.secagg = SecAggConfig.of(config)

    @classmethod
    def check(cls, config: RunConfig) -> None:
        """Cross-key checks; raise ConfigError with one line."""
        partitioner = config["partitioner"]
        if partitioner != "auto" and partitioner not in cls.partitioners:
            raise ConfigError(
                f"partitioner {partitioner!r} does not fit strategy '{cls.name}'; "
                "valid choices: auto, " + ", ".join(cls.partitioners)
            )
        shared = SharedConfig.of(config)
        if shared.dataset == PARTIES:
            cls.check_parties(config)
        else:
            cls.check_dataset(config)
        clients = shared.num_clients  # 0: every connected SuperNode, known only at run time
        if 0 < clients < shared.min_clients:
            raise ConfigError(f"min-clients={config['min-clients']} exceeds num-clients={clients}; valid: "
                              f"1..{clients}")
        secure = [p.key for p in cls.params if p.key.endswith(".secure") and config[p.key]]
        if secure and clients == 1:
            raise ConfigError(f"{secure[0]}=true with num-clients=1: secure aggregation needs at least 2 clients; "
                              f"valid: num-clients >= 2 or {secure[0]}=false")
        if secure and clients:
            from fedgraphcore.privacy.secagg import FixedPointEncoder, SecAggOverflowError

            try:
                FixedPointEncoder(config["secagg.scale"], config["secagg.bound"], clients)
            except SecAggOverflowError:
                raise ConfigError(f"secagg.bound={config['secagg.bound']:g} x secagg.scale={config['secagg.scale']:g}"
                                  f" x {clients} clients does not fit the 64-bit ring of {secure[0]}; valid: a "
                                  "product below 2^63") from None

    @classmethod
    def hello_ask(cls, config: RunConfig, clients: int) -> HelloAsk:
        """What this method asks of every client with hello (its :meth:`hello_values`, what its
        clients add, :meth:`hello_reply`, and the secure-aggregation key when
        :meth:`masks_uploads`), so that its protocol needs no round of its own for them."""
        from fedgraphcore.session import HelloAsk

        return HelloAsk(cls.hello_values(config), cls.hello_reply(config), cls.masks_uploads(config, clients))

    @classmethod
    def hello_values(cls, config: RunConfig) -> dict:
        """Values every client gets with hello (its client's ``hello_figures`` / ``hello_arrays`` read them)."""
        return {}

    @classmethod
    def hello_reply(cls, config: RunConfig) -> ReplySpec:
        """What each client adds to its hello reply: figures (``ClusteringClient.hello_figures``, kept
        in ``session.clients[i].summary``) and arrays (``ClusteringClient.hello_arrays``, kept in
        ``session.clients[i].arrays``), checked like any reply; nothing by default."""
        return ReplySpec()

    @classmethod
    def masks_uploads(cls, config: RunConfig, clients: int) -> bool:
        """Whether a run of ``clients`` clients will mask uploads under secure aggregation (then
        the clients send their public keys with hello): by default, with a ``<method>.secure``
        key set and more than one client. A run that masks without saying so here still works,
        with two more rounds for the key exchange."""
        return clients > 1 and any(p.key.endswith(".secure") and config[p.key] for p in cls.params)

    @staticmethod
    def check_parties(config: RunConfig) -> None:
        """A run on the parties' own data: the server holds none, so it cannot count classes
        or score against an evaluation file."""
        if SharedConfig.of(config).num_clusters == 0:
            raise ConfigError(f"num-clusters=0 (the number of classes) with dataset={PARTIES!r}: the server holds "
                              "no labels to count; valid: num-clusters >= 1")
        if config["eval-file"]:
            raise ConfigError(f"eval-file with dataset={PARTIES!r}: the parties' data is nowhere else to score "
                              "against; valid: eval-file=''")

    @classmethod
    def check_dataset(cls, config: RunConfig) -> None:
        """A built-in dataset fits the method (:meth:`check_data` on its known profile, before anything
        loads); a dataset given by path is checked once loaded (``app.run`` loads it before any engine
        starts, the ServerApp before it connects)."""
        from fedgraphcore.data.datasets import builtin_profile, is_builtin

        dataset = SharedConfig.of(config).dataset
        if is_builtin(dataset):
            cls.check_data(config, builtin_profile(dataset, config["sbm.features"]))

    @classmethod
    def check_data(cls, config: RunConfig, profile) -> None:
        """The data (its :class:`fedgraphcore.data.datasets.DataProfile`) has what the method and the partitioner
        use: one graph or a collection, edges, node features, labels or a cluster count, and edge weights
        only where the method uses them."""
        from fedgraphcore.data.datasets import BUILTIN_PROFILES, COLLECTION_PARTITIONERS

        shared = SharedConfig.of(config)
        dataset = memory.shown(shared.dataset)
        partitioner = cls.partitioners[0] if shared.partitioner == "auto" else shared.partitioner
        if profile.collection != (partitioner in COLLECTION_PARTITIONERS):
            shape = "a graph collection" if profile.collection else "one graph"
            valid = ("one graph (e.g. karate, sbm, cora, or an edge list)" if profile.collection
                     else "a graph collection: " + ", ".join(k for k, v in BUILTIN_PROFILES.items() if v.collection)
                     + ", or a directory of graphs")
            raise ConfigError(f"dataset {dataset} is {shape}; strategy '{cls.name}' with partitioner "
                              f"{partitioner!r} needs {valid}")
        if cls.needs_edges and not profile.edges:
            raise ConfigError(f"dataset {dataset} has no edges; strategy '{cls.name}' needs them; "
                              "valid: a dataset with edges, e.g. karate, sbm, cora")
        if cls.needs_features and not profile.features:
            raise ConfigError(f"dataset {dataset} has no node features; strategy '{cls.name}' needs them; "
                              "valid: a dataset with features, e.g. sbm (sbm.features > 0), cora, citeseer, or a "
                              "node table with feature columns")
        if profile.weighted and cls.refuses_weights:
            raise ConfigError(f"dataset {dataset} has edge weights; strategy '{cls.name}' {cls.refuses_weights}; "
                              "valid: data.weighted=false (every edge weight 1) or an unweighted graph")
        if not profile.labels and not shared.num_clusters:
            raise ConfigError(f"dataset {dataset} has no labels; valid: num-clusters >= 1 (the number of clusters "
                              "to find)")

    @classmethod
    def check_shards(cls, clients) -> list[str]:
        """What the shards announced in the hello handshake (``clients``: :class:`fedgraphcore.session.ClientInfo`)
        allow: a client holding no items, or a structure method without a single edge, stops the run
        (a :class:`ProtocolError` naming the clients); returns warnings where the data merely supports
        the method weakly (:data:`ISOLATED_WARN`, :data:`ISOLATED_STOP`)."""
        from fedgraphcore.data.parties import family

        if not clients:
            return []
        graphs = family(str(clients[0].summary["partitioner"])) == "graphs"
        item, count = ("graphs", "num_graphs") if graphs else ("rows", "num_rows")
        empty = [c.partition_id for c in clients if not int(c.summary[count])]
        if empty:
            raise ProtocolError(f"{_clients_hold(empty)} no {item}: an empty shard; valid: fewer clients or a "
                                f"split that gives each some {item}")
        if graphs or not cls.needs_edges:
            return []
        edges = {c.partition_id: int(c.summary["num_edges"]) for c in clients}
        if not any(edges.values()):
            raise ProtocolError(f"no client holds an edge in its shard; strategy '{cls.name}' clusters by the "
                                "edges; valid: a graph with edges (and a split that keeps some within the shards)")
        if not cls.local_graphs:
            return []
        rows = sum(int(c.summary["num_rows"]) for c in clients)
        share = sum(int(c.summary["num_isolated"]) for c in clients) / rows
        bare = [p for p, e in edges.items() if not e]
        what = (f"{share:.0%} of the clients' rows have no edge in their own shard"
                + (f" and {_clients_hold(bare)} none at all" if bare else ""))
        if share > ISOLATED_STOP:
            raise ProtocolError(f"{what}: strategy '{cls.name}' clusters each shard's own graph, and these carry "
                                f"almost no structure (over {ISOLATED_STOP:.0%}); valid: fewer clients, or a method "
                                "that combines the shards before clustering (e.g. fedspectral-plus)")
        if share > ISOLATED_WARN or bare:
            return [f"{what}: strategy '{cls.name}' clusters each shard's own graph, so the result rests on little "
                    "structure; fewer clients give each more edges"]
        return []

    @abstractmethod
    def run(self, session: ServerSession) -> StrategyOutput:
        """Run the protocol; return the clustering.

        Parameters
        ----------
        session : fedgraphcore.session.ServerSession
            The connected clients (hello done) and the exchange every step goes through:
            :meth:`~fedgraphcore.session.ServerSession.exchange` / ``broadcast`` for a step,
            ``secagg_values`` / ``secure_sum`` for a masked sum, ``round_done`` for progress.

        Returns
        -------
        StrategyOutput
            The labels (of the server's items: nodes, graphs or k-hop subgraphs), the per-round
            history and the method's own metrics.

        Raises
        ------
        fedgraphcore.wire.ProtocolError
            A step cannot go on: a rejected reply, too few clients, a malformed upload (one line
            naming the client and why).
        """

    def reference(self, data: GraphData | GraphCollection) -> np.ndarray | None:
        """Labels of the centralised counterpart on the pooled ``data``.

        Parameters
        ----------
        data : GraphData or GraphCollection
            The whole dataset, as one organisation holding everything would have it.

        Returns
        -------
        ndarray of int64 or None
            One label per item, with this run's ``num-clusters`` and seed; None: no
            counterpart (the server then scores the federated labels alone).
        """
        return None

    def reference_method(self) -> str | None:
        """What :meth:`reference` computes, with this run's parameters (one line), or None."""
        return None

    def _k_and_seed(self) -> str:
        return f"k = {self.shared.num_clusters}, seed {self.shared.seed}"


def common_feature_dimension(widths) -> int:
    """The feature width every client reported; clients that disagree stop the run."""
    dims = sorted({int(w) for w in widths})
    if len(dims) != 1:
        raise ProtocolError(f"clients disagree on the feature dimension: {dims}")
    return dims[0]


def concat_int64(parts) -> np.ndarray:
    """Integer arrays from several clients as one int64 array: each part is cast first,
    since an int64 and a uint64 part would concatenate to float64."""
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def check_item_ids(session: ServerSession, step: str, ids_by_node: Mapping[int, np.ndarray], exclusive: bool,
                   expected: Mapping[int, int] | None = None, below: int | None = None) -> None:
    """Stop the run, naming the clients, on final item ids that cannot be theirs: negative
    once cast to int64 (a uint64 id at or above 2^63 wraps there), at or above ``below``,
    sent by two clients when ``exclusive`` (every item lives on one client), or, with
    ``expected`` (node id -> count), a count other than the client announced. Without
    ``below``, ids beyond the data are refused where the labels are laid out
    (:meth:`StrategyOutput.dense_labels`), which cannot tell whose they were."""
    ids = {node: np.asarray(a, dtype=np.int64) for node, a in ids_by_node.items()}
    repeated = np.empty(0, np.int64)
    if exclusive and ids:
        values, counts = np.unique(np.concatenate(list(ids.values())), return_counts=True)
        repeated = values[counts > 1]
    problems = []
    for node, a in ids.items():
        found = [f"{n} {what}" for n, what in (
            (int((a < 0).sum()), "negative ids"),
            (int((a >= below).sum()) if below is not None else 0, f"ids at or above {below}"),
            (int(np.isin(a, repeated).sum()), "ids another client also sent")) if n]
        if expected is not None and a.size != expected[node]:
            found.append(f"{a.size} ids for the {expected[node]} rows it announced")
        if found:
            problems.append(f"client {session.partition_of(node)}: " + ", ".join(found))
    if problems:
        raise ProtocolError(f"step '{step}': item ids that cannot be the client's: " + "; ".join(problems))


def announced_rows(session: ServerSession) -> dict[int, int]:
    """The rows (nodes or samples) each client announced in the hello handshake, by node id."""
    return {c.node_id: int(c.summary["num_rows"]) for c in session.clients}


def common_node_count(session: ServerSession, strategy: str, partitioner: str) -> int:
    """n from the hello handshake, for strategies whose clients all hold every node
    (``partitioner``: vertical or edge split); clients that disagree stop the run."""
    counts = {c.partition_id: int(c.summary["num_rows"]) for c in session.clients}
    parts = {str(c.summary["partitioner"]) for c in session.clients}
    if len(set(counts.values())) != 1 or parts != {partitioner}:
        raise ProtocolError(f"{strategy} needs every client to hold all nodes (partitioner '{partitioner}'); "
                            f"node count per client: {counts}, partitioners: {sorted(parts)}")
    return next(iter(counts.values()))
