"""Partitioners: cut one dataset into per-client :class:`Shard` objects.

Every partitioner is deterministic given ``seed`` and hands each client only
its own share. ``partition(data, partitioner, num_clients, seed=0, **params)``
dispatches on the name; unknown names or parameters raise a one-line
:class:`~fedgraphcore.config.ConfigError`.

========================  =====================================================
name                      what client ``c`` gets
========================  =====================================================
``node-random``           a random, near-equal set of nodes and the subgraph
                          they induce; rows of ``x``/``y`` for those nodes.
                          ``boundary`` (default True): the edges from its
                          owned nodes to nodes it does not hold are its
                          boundary edges (``Shard.boundary``); False drops
                          them (the papers' node splits). ``overlap`` = share
                          of nodes also copied to one other random client.
``node-community``        whole communities (:mod:`fedgraphcore.data.communities`:
                          ``'louvain'``, pure Python, for up to ~10^6 edges,
                          or balanced ``'spectral'`` parts), packed largest-
                          first onto the least-loaded client (fewer communities
                          than clients: the largest are bisected); then as
                          ``node-random``.
``node-dirichlet``        label-skewed node sets: for each class, the class's
                          nodes are split over clients by proportions drawn
                          from ``Dirichlet(alpha)`` (small alpha = strong skew),
                          re-drawn until every client has ``min_size`` nodes.
``edge``                  FedSpectral setting: all node ids (``node_ids`` =
                          all nodes, ``adj`` is n x n) but only some edges:
                          each undirected edge goes to ``r`` distinct random
                          clients out of ``C`` (``r = replicas`` if > 0, else
                          ``max(1, round(overlap * C))``). ``edge_weight`` is
                          aligned with ``adj.data`` and holds ``r`` for every
                          local edge, so ``sum_c adj_c.data / edge_weight_c``
                          recovers the global adjacency. ``x``/``y`` are not
                          given unless ``with_features``.
``vertical``              kCAGC setting: all nodes and the whole graph, but
                          only a block of feature columns (``feature_cols``,
                          in increasing order); blocks are ``contiguous``,
                          ``random``, or of given ``sizes`` ("3,5,2").
``sample``                FedSC setting: a random near-equal set of rows (no
                          overlap); ``adj`` is the induced subgraph (empty for
                          non-graph data).
``sample-dirichlet``      rows split by Dirichlet label skew (as node-dirichlet,
                          no overlap).
``khop``                  GW-LDP clustering setting: a set of centre nodes
                          (``centres`` in total, 0 = all nodes, split equally
                          at random over clients); for each centre the
                          ``hops``-hop subgraph around it (centre first, then
                          nearer nodes, capped at ``max_nodes`` if > 0) as a
                          :class:`GraphData`; ``graph_ids`` = centre ids,
                          ``graph_y`` = centre labels (pseudo-labels).
                          ``node_ids`` = all nodes appearing in its subgraphs.
``graph-dirichlet``       GW-LDP classification setting: a share of a
                          :class:`GraphCollection`, split by Dirichlet label
                          skew; ``graphs``, ``graph_ids``, ``graph_y``.
========================  =====================================================

All node partitions set ``owned`` (bool per held node): each node is owned by
exactly one client, copies made by ``overlap`` are not owned. Boundary edges
start at owned nodes only, so every edge of the graph is, for each end's owner,
either an edge of the subgraph it holds or one of its boundary edges.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from .communities import louvain, spectral_parts
from .types import Boundary, GraphCollection, GraphData, Shard

PARTITIONERS: tuple[str, ...] = (
    "node-random",
    "node-community",
    "node-dirichlet",
    "edge",
    "vertical",
    "sample",
    "sample-dirichlet",
    "khop",
    "graph-dirichlet",
)

#: Keyword parameters each partitioner accepts, with defaults.
PARTITION_PARAMS: dict[str, dict[str, Any]] = {
    "node-random": {"overlap": 0.0, "boundary": True},
    "node-community": {"overlap": 0.0, "community": "louvain", "boundary": True},
    "node-dirichlet": {"overlap": 0.0, "alpha": 0.5, "min_size": 2, "boundary": True},
    "edge": {"overlap": 0.0, "replicas": 0, "with_features": False},
    "vertical": {"split": "contiguous", "sizes": ""},
    "sample": {},
    "sample-dirichlet": {"alpha": 0.5, "min_size": 2},
    "khop": {"hops": 2, "centres": 0, "max_nodes": 0},
    "graph-dirichlet": {"alpha": 0.5, "min_size": 2},
}

#: The run-config key of each keyword parameter (``fedgraphcore.data.params``), named beside it in errors.
RUN_CONFIG_KEYS: dict[str, str] = {
    "overlap": "partition.overlap",
    "boundary": "partition.boundary",
    "replicas": "partition.replicas",
    "with_features": "partition.with-features",
    "alpha": "partition.alpha",
    "min_size": "partition.min-size",
    "community": "partition.community",
    "split": "partition.split",
    "sizes": "partition.sizes",
    "hops": "khop.hops",
    "centres": "khop.centres",
    "max_nodes": "khop.max-nodes",
}
assert all(set(v) <= set(RUN_CONFIG_KEYS) for v in PARTITION_PARAMS.values())


def _name(kwarg: str) -> str:
    """How an error names a parameter: its keyword and its run-config key."""
    return f"'{kwarg}' (run-config '{RUN_CONFIG_KEYS[kwarg]}')"


COMMUNITY_METHODS = ("louvain", "spectral")
VERTICAL_SPLITS = ("contiguous", "random")

_SALT = {name: i + 101 for i, name in enumerate(PARTITIONERS)}


def _rng(seed: int, partitioner: str, *extra: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), _SALT[partitioner], *extra])


# --------------------------------------------------------------------------- dispatch


def partition(data: GraphData | GraphCollection, partitioner: str, num_clients: int,
              seed: int = 0, **params) -> list[Shard]:
    """Cut ``data`` into ``num_clients`` shards with ``partitioner`` (see module doc)."""
    if partitioner not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {partitioner!r}; valid choices: " + ", ".join(PARTITIONERS))
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"invalid number of clients {num_clients!r}; need an integer >= 1")
    num_clients = int(num_clients)
    defaults = PARTITION_PARAMS[partitioner]
    bad = sorted(set(params) - set(defaults))
    if bad:
        raise ConfigError(
            f"unknown parameter {bad[0]!r} for partitioner '{partitioner}'; valid parameters: "
            + (", ".join(defaults) if defaults else "none")
        )
    kw = {**defaults, **{k: _coerce(partitioner, k, v, defaults[k]) for k, v in params.items()}}
    is_coll = isinstance(data, GraphCollection)
    if partitioner == "graph-dirichlet":
        if not is_coll:
            raise ConfigError(
                f"partitioner 'graph-dirichlet' needs a graph collection (mutag, proteins, imdb-binary); "
                f"dataset '{data.name}' is a single graph (use khop to cut it into subgraphs)"
            )
    elif is_coll:
        raise ConfigError(
            f"partitioner '{partitioner}' needs a single graph; dataset '{data.name}' is a graph "
            "collection (use graph-dirichlet)"
        )
    n_items = len(data.graphs) if is_coll else data.num_nodes
    if partitioner not in ("edge", "vertical") and num_clients > n_items:
        raise ConfigError(
            f"cannot split {n_items} {'graphs' if is_coll else 'nodes'} of '{data.name}' over "
            f"{num_clients} clients; use at most {n_items} clients"
        )
    fn = _IMPL[partitioner]
    shards = fn(data, num_clients, seed, **kw)
    for s in shards:
        s.meta.setdefault("seed", int(seed))
        s.meta.setdefault("params", {k: _jsonable(v) for k, v in kw.items()})
    return shards


def _coerce(partitioner: str, name: str, value, default):
    """Cast a parameter to the type of its default (ConfigError on failure)."""
    kind = type(default)
    try:
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            if isinstance(value, (bool, np.bool_, int, np.integer)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if kind is int:
            if isinstance(value, (bool, np.bool_)):
                raise ValueError
            f = float(value)
            if not f.is_integer():
                raise ValueError
            return int(f)
        if kind is float:
            if isinstance(value, (bool, np.bool_)):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value {value!r} for {_name(name)} of partitioner '{partitioner}'; "
                          f"expected {kind.__name__}") from None


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _check_range(name: str, value, low=None, high=None, partitioner: str = "") -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ConfigError(
            f"value {value!r} for {_name(name)} of partitioner '{partitioner}' is out of range; "
            f"valid range: [{lo}, {hi}]"
        )


# --------------------------------------------------------------------------- node partitions


def _induced(adj: sp.csr_matrix, ids: np.ndarray) -> sp.csr_matrix:
    sub = adj[ids][:, ids]
    sub = sp.csr_matrix(sub, dtype=np.float64)
    sub.sort_indices()
    return sub


def _rows(x, ids):
    if x is None:
        return None
    return x[ids]


def _add_overlap(assign: np.ndarray, num_clients: int, overlap: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Extra (node, client) copies: ``round(overlap * n)`` random nodes are also
    given to one other client, chosen uniformly among the remaining ones."""
    n = assign.size
    k = int(round(overlap * n)) if num_clients > 1 else 0
    if k == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    nodes = rng.choice(n, size=k, replace=False)
    extra = (assign[nodes] + rng.integers(1, num_clients, size=k)) % num_clients
    return nodes.astype(np.int64), extra.astype(np.int64)


def boundary_edges(adj: sp.csr_matrix, ids: np.ndarray, owned: np.ndarray) -> Boundary:
    """The edges from the owned rows of ``ids`` (sorted global ids held by one client) to
    nodes outside ``ids``: local row of the owned end, global id of the other end, weight."""
    held = np.zeros(adj.shape[0], dtype=bool)
    held[ids] = True
    owned_rows = np.flatnonzero(owned)
    sub = sp.csr_matrix(adj[ids[owned_rows]])
    row_of = np.repeat(owned_rows, np.diff(sub.indptr))
    away = ~held[sub.indices]
    return Boundary(row_of[away].astype(np.int64), sub.indices[away].astype(np.int64),
                    sub.data[away].astype(np.float64))


def _node_shards(data: GraphData, assign: np.ndarray, num_clients: int, partitioner: str,
                 overlap: float, rng: np.random.Generator, meta: dict | None = None,
                 boundary: bool = False) -> list[Shard]:
    """Build node-partition shards from a primary assignment (node -> client), with each
    client's boundary edges when ``boundary``."""
    _check_range("overlap", overlap, 0.0, 1.0, partitioner)
    dup_nodes, dup_clients = _add_overlap(assign, num_clients, overlap, rng)
    n = data.num_nodes
    all_nodes = np.concatenate([np.arange(n, dtype=np.int64), dup_nodes])
    all_clients = np.concatenate([assign.astype(np.int64), dup_clients])
    all_owned = np.concatenate([np.ones(n, bool), np.zeros(dup_nodes.size, bool)])
    order = np.lexsort((all_nodes, all_clients))
    all_nodes, all_clients, all_owned = all_nodes[order], all_clients[order], all_owned[order]
    bounds = np.searchsorted(all_clients, np.arange(num_clients + 1))
    shards = []
    for c in range(num_clients):
        ids, owned = all_nodes[bounds[c]: bounds[c + 1]], all_owned[bounds[c]: bounds[c + 1]]
        shards.append(Shard(
            client_id=c, num_clients=num_clients, dataset=data.name, partitioner=partitioner,
            node_ids=ids, adj=_induced(data.adj, ids), x=_rows(data.x, ids),
            y=None if data.y is None else data.y[ids], owned=owned,
            boundary=boundary_edges(data.adj, ids, owned) if boundary else None,
            meta={"num_nodes_global": n, "num_owned": int(all_owned[bounds[c]: bounds[c + 1]].sum()),
                  **(meta or {})},
        ))
    return shards


def _balanced_assign(n: int, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Random near-equal assignment: sizes differ by at most one."""
    assign = np.empty(n, dtype=np.int64)
    perm = rng.permutation(n)
    assign[perm] = np.arange(n, dtype=np.int64) % num_clients
    return assign


def _node_random(data, num_clients, seed, overlap, boundary):
    rng = _rng(seed, "node-random")
    assign = _balanced_assign(data.num_nodes, num_clients, rng)
    return _node_shards(data, assign, num_clients, "node-random", overlap, rng, boundary=boundary)


def _node_community(data, num_clients, seed, overlap, community, boundary):
    if community not in COMMUNITY_METHODS:
        raise ConfigError(f"invalid value {community!r} for {_name('community')}; valid choices: "
                          + ", ".join(COMMUNITY_METHODS))
    rng = _rng(seed, "node-community")
    if community == "louvain":
        comm = louvain(data.adj, seed)
    else:
        comm = spectral_parts(data.adj, num_clients, rng)
    sizes = np.bincount(comm)
    found = int(sizes.size)
    while sizes.size < num_clients:
        # Fewer communities than clients: bisect the largest (balanced min-cut).
        big = int(np.argmax(sizes))
        ids = np.flatnonzero(comm == big)
        half = spectral_parts(data.adj[ids][:, ids], 2, rng)
        comm[ids[half == 1]] = sizes.size
        sizes = np.bincount(comm)
    # Largest community first onto the least loaded client (ties: lowest id).
    load = np.zeros(num_clients, dtype=np.int64)
    to_client = np.empty(sizes.size, dtype=np.int64)
    for cm in np.lexsort((rng.random(sizes.size), -sizes)):
        c = int(np.argmin(load))
        to_client[cm] = c
        load[c] += sizes[cm]
    assign = to_client[comm]
    return _node_shards(data, assign, num_clients, "node-community", overlap, rng,
                        {"community": community, "num_communities": found}, boundary=boundary)


def dirichlet_assign(labels: np.ndarray, num_clients: int, alpha: float, min_size: int,
                     rng: np.random.Generator, what: str = "nodes", max_tries: int = 1000) -> np.ndarray:
    """Label-skewed assignment (Hsu et al. 2019): for each label, its items are
    split over clients by proportions ~ Dirichlet(alpha * 1); redrawn until
    every client holds at least ``min_size`` items. Label -1 is its own group."""
    n = labels.size
    if min_size * num_clients > n:
        raise ConfigError(f"min_size {min_size} x {num_clients} clients exceeds the {n} {what}; "
                          f"lower {_name('min_size')}")
    classes, inv = np.unique(labels, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(classes.size + 1))
    for _ in range(max_tries):
        assign = np.empty(n, dtype=np.int64)
        for k in range(classes.size):
            idx = order[bounds[k]: bounds[k + 1]]
            idx = idx[rng.permutation(idx.size)]
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            assign[idx] = np.repeat(np.arange(num_clients), np.diff(np.concatenate([[0], cuts, [idx.size]])))
        if np.bincount(assign, minlength=num_clients).min() >= min_size:
            return assign
    raise ConfigError(f"Dirichlet split with alpha={alpha} did not give every client min_size={min_size} "
                      f"{what} in {max_tries} draws; raise {_name('alpha')} or lower {_name('min_size')}")


def _check_dirichlet(partitioner, alpha, min_size):
    if not alpha > 0:
        raise ConfigError(f"value {alpha!r} for {_name('alpha')} of partitioner '{partitioner}' is out of range; "
                          "need alpha > 0")
    _check_range("min_size", min_size, 0, None, partitioner)


def _labels_or_error(data: GraphData, partitioner: str) -> np.ndarray:
    if data.y is None:
        raise ConfigError(f"partitioner '{partitioner}' needs labels; dataset '{data.name}' has none "
                          "(use node-random or node-community)")
    return data.y


def _node_dirichlet(data, num_clients, seed, overlap, alpha, min_size, boundary):
    _check_dirichlet("node-dirichlet", alpha, min_size)
    rng = _rng(seed, "node-dirichlet")
    assign = dirichlet_assign(_labels_or_error(data, "node-dirichlet"), num_clients, alpha, min_size, rng)
    return _node_shards(data, assign, num_clients, "node-dirichlet", overlap, rng, {"alpha": float(alpha)},
                        boundary=boundary)


def _sample(data, num_clients, seed):
    rng = _rng(seed, "sample")
    assign = _balanced_assign(data.num_nodes, num_clients, rng)
    return _node_shards(data, assign, num_clients, "sample", 0.0, rng)


def _sample_dirichlet(data, num_clients, seed, alpha, min_size):
    _check_dirichlet("sample-dirichlet", alpha, min_size)
    rng = _rng(seed, "sample-dirichlet")
    assign = dirichlet_assign(_labels_or_error(data, "sample-dirichlet"), num_clients, alpha, min_size, rng,
                              what="samples")
    return _node_shards(data, assign, num_clients, "sample-dirichlet", 0.0, rng, {"alpha": float(alpha)})


# --------------------------------------------------------------------------- edge partition


def edge_replicas(num_clients: int, overlap: float = 0.0, replicas: int = 0) -> int:
    """Number of clients ``r`` each edge is given to: ``replicas`` if > 0, else
    ``round(overlap * C)``, clipped to ``[1, C]``."""
    r = int(replicas) if replicas > 0 else int(round(overlap * num_clients))
    return max(1, min(num_clients, r))


def _choose_distinct(rng: np.random.Generator, m: int, num_clients: int, r: int) -> np.ndarray:
    """``(m, r)`` array: for each of ``m`` items, ``r`` distinct clients chosen
    uniformly (Floyd's algorithm, vectorised over items)."""
    dt = np.int16 if num_clients < 2**15 else np.int32
    if r == num_clients:
        return np.broadcast_to(np.arange(num_clients, dtype=dt), (m, r)).copy()
    out = np.empty((m, r), dtype=dt)
    for col, j in enumerate(range(num_clients - r, num_clients)):
        t = rng.integers(0, j + 1, size=m, dtype=np.int64).astype(dt)
        if col:
            taken = (out[:, :col] == t[:, None]).any(axis=1)
            t[taken] = j
        out[:, col] = t
    return out


def _edge(data, num_clients, seed, overlap, replicas, with_features):
    _check_range("overlap", overlap, 0.0, 1.0, "edge")
    _check_range("replicas", replicas, 0, num_clients, "edge")
    rng = _rng(seed, "edge")
    n = data.num_nodes
    r = edge_replicas(num_clients, overlap, replicas)
    up = sp.triu(data.adj, k=1, format="csr")
    rows = np.repeat(np.arange(n, dtype=up.indices.dtype), np.diff(up.indptr))
    cols, weights = up.indices, up.data
    m = cols.size
    del up
    chosen = _choose_distinct(rng, m, num_clients, r)
    # Group (edge, client) pairs by client with a stable counting sort.
    flat_client = chosen.ravel()
    order = np.argsort(flat_client, kind="stable")
    del chosen
    counts = np.bincount(flat_client, minlength=num_clients)
    del flat_client
    bounds = np.concatenate([[0], np.cumsum(counts)])
    all_ids = np.arange(n, dtype=np.int64)
    shards = []
    for c in range(num_clients):
        e = order[bounds[c]: bounds[c + 1]] // r
        rr, cc = rows[e], cols[e]
        adj = sp.csr_matrix(
            (np.tile(weights[e], 2), (np.concatenate([rr, cc]), np.concatenate([cc, rr]))), shape=(n, n),
        )
        adj.sort_indices()
        shards.append(Shard(
            client_id=c, num_clients=num_clients, dataset=data.name, partitioner="edge",
            node_ids=all_ids, adj=adj,
            x=data.x if with_features else None, y=None,
            edge_weight=np.full(adj.nnz, float(r)),
            meta={"replicas": r, "num_edges_global": int(m), "num_nodes_global": n},
        ))
    return shards


# --------------------------------------------------------------------------- vertical


def _vertical(data, num_clients, seed, split, sizes):
    if data.x is None:
        raise ConfigError(f"partitioner 'vertical' needs node features; dataset '{data.name}' has none")
    f = data.x.shape[1]
    rng = _rng(seed, "vertical")
    if sizes not in ("", None):
        try:
            sz = [int(s) for s in str(sizes).replace(";", ",").split(",") if s.strip()]
        except ValueError:
            raise ConfigError(f"invalid value {sizes!r} for {_name('sizes')}; "
                              "expected comma-separated integers") from None
        if len(sz) != num_clients or min(sz) < 1 or sum(sz) != f:
            raise ConfigError(f"invalid value {sizes!r} for {_name('sizes')}; need {num_clients} positive integers "
                              f"summing to the {f} feature columns")
        sz = np.array(sz)
    else:
        if num_clients > f:
            raise ConfigError(f"cannot split {f} feature columns of '{data.name}' over {num_clients} clients")
        sz = np.full(num_clients, f // num_clients)
        sz[: f % num_clients] += 1
    if split not in VERTICAL_SPLITS:
        raise ConfigError(f"invalid value {split!r} for {_name('split')}; valid choices: "
                          + ", ".join(VERTICAL_SPLITS))
    cols = np.arange(f, dtype=np.int64) if split == "contiguous" else rng.permutation(f).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(sz)])
    x = data.x.tocsc() if sp.issparse(data.x) else data.x
    shards = []
    all_ids = np.arange(data.num_nodes, dtype=np.int64)
    for c in range(num_clients):
        fc = np.sort(cols[bounds[c]: bounds[c + 1]])
        xc = x[:, fc]
        if sp.issparse(xc):
            xc = sp.csr_matrix(xc)
            xc.sort_indices()
        shards.append(Shard(
            client_id=c, num_clients=num_clients, dataset=data.name, partitioner="vertical",
            node_ids=all_ids, adj=data.adj, x=xc, y=None, feature_cols=fc,
            meta={"split": split, "num_features_global": int(f)},
        ))
    return shards


# --------------------------------------------------------------------------- k-hop


def khop_nodes(adj: sp.csr_matrix, centre: int, hops: int, max_nodes: int,
               rng: np.random.Generator) -> np.ndarray:
    """Nodes within ``hops`` of ``centre`` in BFS layer order (centre first, each
    layer sorted); with ``max_nodes > 0`` the last layer that does not fit is
    subsampled at random."""
    n = adj.shape[0]
    seen = np.zeros(n, dtype=bool)
    seen[centre] = True
    out = [np.array([centre], dtype=np.int64)]
    total = 1
    frontier = out[0]
    for _ in range(hops):
        if frontier.size == 0 or (max_nodes and total >= max_nodes):
            break
        nb = np.unique(adj[frontier].indices.astype(np.int64))
        nb = nb[~seen[nb]]
        if max_nodes and total + nb.size > max_nodes:
            nb = np.sort(rng.choice(nb, size=max_nodes - total, replace=False))
        seen[nb] = True
        out.append(nb)
        total += nb.size
        frontier = nb
    return np.concatenate(out)


def _khop(data, num_clients, seed, hops, centres, max_nodes):
    _check_range("hops", hops, 0, None, "khop")
    _check_range("centres", centres, 0, data.num_nodes, "khop")
    _check_range("max_nodes", max_nodes, 0, None, "khop")
    rng = _rng(seed, "khop")
    n = data.num_nodes
    k = n if centres == 0 else int(centres)
    if k < num_clients:
        raise ConfigError(f"khop: {k} centres cannot be split over {num_clients} clients; raise {_name('centres')}")
    chosen = rng.choice(n, size=k, replace=False).astype(np.int64)
    assign = np.arange(k) % num_clients
    adj = data.adj
    shards = []
    for c in range(num_clients):
        cs = np.sort(chosen[assign == c])
        graphs, union = [], []
        for centre in cs:
            ids = khop_nodes(adj, int(centre), int(hops), int(max_nodes), rng)
            union.append(ids)
            graphs.append(GraphData(
                name=f"{data.name}/khop-{int(centre)}", adj=_induced(adj, ids), x=_rows(data.x, ids), y=None,
                meta={"centre": int(centre), "centre_local": 0, "node_ids": [int(i) for i in ids]},
            ))
        gy = data.y[cs] if data.y is not None else np.full(cs.size, -1, dtype=np.int64)
        shards.append(Shard(
            client_id=c, num_clients=num_clients, dataset=data.name, partitioner="khop",
            node_ids=np.unique(np.concatenate(union)) if union else np.empty(0, np.int64),
            graphs=graphs, graph_ids=cs, graph_y=gy,
            meta={"hops": int(hops), "max_nodes": int(max_nodes), "num_nodes_global": n},
        ))
    return shards


# --------------------------------------------------------------------------- graph collections


def _graph_dirichlet(data: GraphCollection, num_clients, seed, alpha, min_size):
    _check_dirichlet("graph-dirichlet", alpha, min_size)
    rng = _rng(seed, "graph-dirichlet")
    assign = dirichlet_assign(data.y, num_clients, alpha, min_size, rng, what="graphs")
    shards = []
    for c in range(num_clients):
        ids = np.flatnonzero(assign == c).astype(np.int64)
        shards.append(Shard(
            client_id=c, num_clients=num_clients, dataset=data.name, partitioner="graph-dirichlet",
            node_ids=np.empty(0, dtype=np.int64), graphs=[data.graphs[i] for i in ids],
            graph_ids=ids, graph_y=data.y[ids],
            meta={"alpha": float(alpha), "num_graphs_global": len(data.graphs)},
        ))
    return shards


_IMPL = {
    "node-random": _node_random,
    "node-community": _node_community,
    "node-dirichlet": _node_dirichlet,
    "edge": _edge,
    "vertical": _vertical,
    "sample": _sample,
    "sample-dirichlet": _sample_dirichlet,
    "khop": _khop,
    "graph-dirichlet": _graph_dirichlet,
}
