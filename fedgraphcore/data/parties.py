"""One party's own data as the :class:`Shard` its client holds (``dataset = 'parties'``).

In a run with the reserved dataset value ``parties`` nobody cuts a whole
graph: every party (a deployed SuperNode with node config ``data = PATH``, or
one piece of the list given to :func:`app.api.cluster`) holds only its own
piece, and :func:`party_shard` turns that piece into the shard its client
uses. The split family comes from the run's partitioner (``auto``: the
strategy's own):

==========  =====================  ==========================================================
family      partitioners           the piece, and what the shard holds
==========  =====================  ==========================================================
node        node-*, sample*        its nodes (rows, with features) and the edges among them;
                                   node-* with ``partition.boundary``: also its edges to IDs
                                   its node table does not list (boundary edges, another
                                   party's nodes), read from an edge list with a node table
khop        khop                   as node; the k-hop subgraphs around its own nodes, inside
                                   its own subgraph (``khop.centres``: per party, 0 = all)
edge        edge                   its edges over the node IDs every party holds
vertical    vertical               its feature columns of the node IDs every party holds, and
                                   the shared graph
graphs      graph-dirichlet        its graphs with their graph labels
==========  =====================  ==========================================================

Item ids. A user's node and graph IDs never leave the party. For the
shared-node families (edge, vertical) every party holds the same nodes in the
same canonical order (sorted IDs), so row i is the same node on every party;
the hello reply carries :func:`node_set_digest` of the ordered ID list, and
parties whose digests differ stop the run (:func:`node_set_mismatch`). For
the other families a party's items are its rows 0..n_p-1 (``Shard.node_ids``,
or ``graph_ids`` for graphs): the server turns them into positions with
:func:`to_positions`, offset by the items of the parties before it in
partition order (:func:`item_offsets`, from the hello counts).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.disclosure import disclosing

from . import memory
from .params import dataset_kwargs, partition_kwargs
from .partition import PARTITIONERS, edge_replicas, partition
from .types import GraphCollection, GraphData, Shard, no_boundary

#: The reserved dataset value of a run whose parties bring their own data.
PARTIES = "parties"

#: Node-config keys of a party's SuperNode: its data (a file or directory, or a registered
#: ``memory:`` name in-process), its partition id (else the server assigns one by Flower
#: node id), the directory its labels.csv goes to, and ``read.<option>`` reader options.
DATA_KEY, PARTITION_KEY, OUT_KEY, READ_PREFIX = "data", "partition-id", "out-dir", "read."

#: Split family of each partitioner.
FAMILY: dict[str, str] = {
    "node-random": "node",
    "node-community": "node",
    "node-dirichlet": "node",
    "sample": "node",
    "sample-dirichlet": "node",
    "khop": "khop",
    "edge": "edge",
    "vertical": "vertical",
    "graph-dirichlet": "graphs",
}
assert set(FAMILY) == set(PARTITIONERS)
#: Families in which every party holds the same node set.
SHARED_NODES = ("edge", "vertical")


def family(partitioner: str) -> str:
    """The split family of ``partitioner`` (a resolved one, not ``auto``)."""
    try:
        return FAMILY[partitioner]
    except KeyError:
        raise ConfigError(f"unknown partitioner {partitioner!r}; valid choices: " + ", ".join(FAMILY)) from None


def party_labels(y: np.ndarray | None, meta: Mapping[str, Any]) -> np.ndarray | None:
    """A party's labels as its own class values where those are whole numbers >= 0 (the
    reader numbers the classes a file holds 0..C-1, so a party holding classes 1 and 3 would
    otherwise call them 0 and 1, and parties would disagree), else the reader's numbers."""
    names = meta.get("label_names")
    if y is None or not names or not all(isinstance(v, (int, np.integer)) and v >= 0 for v in names):
        return y
    return np.where(y >= 0, np.asarray(names, dtype=np.int64)[np.maximum(y, 0)], -1)


def unusable(message: str, rule: str) -> ConfigError:
    """A party's data the split cannot use: ``message`` for the party, ``rule`` for the server."""
    return ConfigError(message, public=f"data check failed: the party's data, rule '{rule}'")


def party_shard(piece: GraphData | GraphCollection, partitioner: str, partition_id: int, num_partitions: int,
                *, seed: int = 0, params: Mapping[str, Any] | None = None, source: str = "the party's data") -> Shard:
    """The shard of the party ``partition_id`` of ``num_partitions`` holding ``piece``.

    ``partitioner`` picks the split family (module docstring); ``params`` are its keyword
    parameters (:func:`fedgraphcore.data.params.partition_kwargs`): ``edge`` reads ``replicas`` /
    ``overlap`` (how many parties hold each edge, as the partitioner's ``r``: every local edge
    then counts 1/r) and ``with_features``, ``khop`` reads ``hops``, ``centres`` (per party) and
    ``max_nodes``. ``source`` names the data in errors (the party's own; :func:`unusable`).
    ``node_ids`` are the party's rows 0..n-1, ``keys`` its own item IDs."""
    kind = family(partitioner)
    params = dict(params or {})
    if not 0 <= int(partition_id) < int(num_partitions):
        raise ConfigError(f"partition id {partition_id!r} is out of range for {num_partitions} partitions",
                          public=f"partition id out of range 0..{int(num_partitions) - 1}")
    collection = isinstance(piece, GraphCollection)
    if collection != (kind == "graphs"):
        held = "a collection of graphs" if collection else "one graph"
        need = "a collection of graphs" if kind == "graphs" else "one graph (nodes and edges)"
        raise unusable(f"{source} is {held}; partitioner '{partitioner}' needs {need}",
                       f"partitioner {partitioner} needs {need}")
    common = {"client_id": int(partition_id), "num_clients": int(num_partitions), "dataset": PARTIES,
              "partitioner": partitioner, "keys": piece.keys}
    if kind == "graphs":
        return Shard(node_ids=np.empty(0, np.int64), graphs=list(piece.graphs),
                     graph_ids=np.arange(len(piece.graphs), dtype=np.int64),
                     graph_y=np.asarray(party_labels(piece.y, piece.meta), dtype=np.int64),
                     meta={"num_graphs": len(piece.graphs)}, **common)
    _check_nodes(piece, kind, partitioner, source)
    n = piece.num_nodes
    rows = np.arange(n, dtype=np.int64)
    if kind == "vertical":
        if piece.x is None or piece.x.shape[1] == 0:
            raise unusable(f"{source} has no feature columns; partitioner 'vertical' needs this party's columns",
                           "feature columns for partitioner vertical")
        return Shard(node_ids=rows, adj=piece.adj, x=piece.x, meta={"num_features": int(piece.x.shape[1])}, **common)
    if kind == "edge":
        r = edge_replicas(int(num_partitions), float(params.get("overlap", 0.0)), int(params.get("replicas", 0)))
        return Shard(node_ids=rows, adj=piece.adj, x=piece.x if params.get("with_features") else None,
                     edge_weight=np.full(piece.adj.nnz, float(r)), meta={"replicas": r}, **common)
    y = party_labels(piece.y, piece.meta)
    if kind == "khop":
        labelled = GraphData(piece.name, piece.adj, piece.x, y)
        local = partition(labelled, "khop", 1, seed=seed, **{k: v for k, v in params.items()
                                                             if k in ("hops", "centres", "max_nodes")})[0]
        return Shard(node_ids=rows, graphs=local.graphs, graph_ids=local.graph_ids, graph_y=local.graph_y,
                     meta=local.meta, **common)
    boundary = (piece.boundary or no_boundary(piece.keys.dtype)) if params.get("boundary") else None
    return Shard(node_ids=rows, adj=piece.adj, x=piece.x, y=y, owned=np.ones(n, dtype=bool), boundary=boundary,
                 meta={"num_owned": n}, **common)


def _check_nodes(piece: GraphData, kind: str, partitioner: str, source: str) -> None:
    """A piece without nodes, and edges to nodes its node table does not list where every party
    holds every node: refused."""
    if piece.num_nodes == 0:
        raise unusable(f"{source} holds no nodes", "one node or more")
    if kind in SHARED_NODES and piece.boundary is not None and len(piece.boundary):
        raise unusable(f"{source} has {len(piece.boundary)} edge(s) to nodes its node table does not list (first: "
                       f"{piece.boundary.keys[0]!s}); with partitioner '{partitioner}' every party holds every node",
                       f"edges among the node table's nodes with partitioner {partitioner}")


def num_items(shard: Shard) -> int:
    """The items a party's positions count: its graphs (graph split), else its node rows."""
    return shard.num_graphs if family(shard.partitioner) == "graphs" else shard.num_nodes


# --------------------------------------------------------------------------- a party's node


def read_options(node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The reader options of a node config, typed: ``read.<option>`` is the run-config key
    ``data.<option>`` of a dataset given by path (``read.label-column='class'``,
    ``read.weighted=false``, ``read.node-table=...``); another ``read.`` key is a one-line ConfigError."""
    from .datasets import PATH_PARAMS

    valid = {f"{READ_PREFIX}{name.replace('_', '-')}" for name in PATH_PARAMS}
    given = {k: v for k, v in node_config.items() if k.startswith(READ_PREFIX)}
    for key in sorted(set(given) - valid):
        raise ConfigError(f"unknown node config key {key!r}; valid: " + ", ".join(sorted(valid)),
                          public=f"node config '{READ_PREFIX}*', rule 'the reader's options'")
    with disclosing(f"node config '{READ_PREFIX}*', rule 'the reader's option values'"):
        return dataset_kwargs({"data." + k[len(READ_PREFIX):]: v for k, v in given.items()}, PARTIES)


def load_piece(spec: str, options: Mapping[str, Any] | None = None, boundary: bool = False) -> GraphData | GraphCollection:
    """A party's piece: the data registered as ``spec`` (``memory:...``), else its file or
    directory read by :func:`fedgraphcore.data.formats.read_graph` with ``options`` (``boundary``: its
    edge list may name other parties' nodes); read once per process while the files stay
    unchanged. Shared object: do not mutate."""
    if memory.is_memory(spec):
        return memory.lookup(spec)
    from .datasets import source_stamp
    from .formats import read_graph
    from .shards import remember

    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(f"node config {DATA_KEY}={spec!r}: no such file or directory; valid: the party's data "
                          "file or directory", public=f"node config '{DATA_KEY}', rule 'an existing file or directory'")
    key = (str(path.resolve()), source_stamp(str(path), dict(options or {})), tuple(sorted((options or {}).items())),
           boundary)
    return remember(_PIECES, key, lambda: read_graph(str(path), boundary=boundary, **dict(options or {})), _MAX_CACHED)


def reads_boundary(config_values: Mapping[str, Any]) -> bool:
    """Whether a party's edge list may name other parties' nodes in this run: a node split
    (``node-*``) with ``partition.boundary``; else an edge to an ID its node table does not list
    is an error."""
    partitioner = str(config_values["partitioner"])
    return bool(partition_kwargs(partitioner, config_values).get("boundary")) if partitioner in FAMILY else False


def party_node_shard(config_values: Mapping[str, Any], node_config: Mapping[str, Any], partition_id: int,
                     num_partitions: int) -> Shard:
    """The shard of the party whose SuperNode has ``node_config`` (its ``data``), for the run
    ``config_values`` (a validated run-config's values: partitioner, seed, partition keys);
    built once per process."""
    spec = str(node_config.get(DATA_KEY) or "")
    if not spec:
        raise ConfigError(f"dataset={PARTIES!r}: this SuperNode has no node config '{DATA_KEY}'; valid: "
                          f"--node-config \"{DATA_KEY}='/path/to/its/data'\"",
                          public=f"node config '{DATA_KEY}', rule 'set with dataset {PARTIES}'")
    if node_config.get("shard"):
        raise ConfigError(f"dataset={PARTIES!r} reads node config '{DATA_KEY}', not 'shard'; valid: only "
                          f"{DATA_KEY}=PATH", public=f"node config 'shard', rule 'not with dataset {PARTIES}'")
    from .shards import remember

    options = read_options(node_config)
    partitioner, seed = str(config_values["partitioner"]), int(config_values["seed"])
    params = partition_kwargs(partitioner, config_values)
    piece = load_piece(spec, options, boundary=reads_boundary(config_values))
    key = (id(piece), partitioner, int(partition_id), int(num_partitions), seed, tuple(sorted(params.items())))
    source = "in-memory piece" if memory.is_memory(spec) else f"{DATA_KEY}={spec!r}"
    # the entry holds the piece, so its id cannot be reused while cached
    return remember(_SHARDS, key, lambda: (piece, party_shard(piece, partitioner, partition_id, num_partitions,
                                                               seed=seed, params=params, source=source)),
                     _MAX_CACHED)[1]


_MAX_CACHED = 64  # an in-process run keeps every party in one process
_PIECES: "OrderedDict[tuple, GraphData | GraphCollection]" = OrderedDict()
_SHARDS: "OrderedDict[tuple, tuple]" = OrderedDict()


# --------------------------------------------------------------------------- the server's positions


def item_offsets(partitioner: str, counts: list[int]) -> list[int]:
    """Where each party's items start among the server's positions, parties in
    partition order: after the items of the parties before it, or 0 for all in the
    shared-node families (every party holds the same nodes)."""
    if family(partitioner) in SHARED_NODES:
        return [0] * len(counts)
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]])] if counts else []


def to_positions(local_ids: np.ndarray, offset: int, count: int) -> np.ndarray:
    """A party's item ids (its rows 0..count-1) as the server's positions ``offset + id``;
    ``ValueError`` for an id outside its rows (it would land on another party's items)."""
    ids = np.asarray(local_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= count):
        raise ValueError(f"item ids in [{ids.min()}, {ids.max()}], outside its {count} rows 0..{count - 1}")
    return ids + int(offset)


# --------------------------------------------------------------------------- shared node sets


def node_set_digest(keys: np.ndarray) -> str:
    """SHA-256 (hex) of a party's node IDs in row order: equal digests mean the same IDs in
    the same order. Each ID is hashed as its text (an integer ID 7 and a text ID "7" are the
    same node) with its length in front, so no two lists share an encoding."""
    h = hashlib.sha256()
    for key in np.asarray(keys).tolist():
        text = str(key).encode()
        h.update(len(text).to_bytes(8, "little"))
        h.update(text)
    return h.hexdigest()


def node_set_mismatch(partitioner: str, counts: Mapping[int, int], digests: Mapping[int, str]) -> str | None:
    """One line when the parties (partition id -> node count / digest) do not all hold the
    same node IDs, naming the counts and nothing else about the IDs; None when they do."""
    if len(set(digests.values())) <= 1:
        return None
    listed = ", ".join(f"party {p}: {counts[p]}" for p in sorted(counts))
    same = " (equal counts, different IDs)" if len(set(counts.values())) == 1 else ""
    return (f"partitioner '{partitioner}' needs the same node IDs on every party, but the parties' node sets "
            f"differ{same}; node counts: {listed}")
