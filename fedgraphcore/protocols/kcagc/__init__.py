"""kCAGC (Zhang et al., "Attributed Graph Clustering in Collaborative Settings"): protocol math.

Setting: L parties hold different feature columns ``X^l`` of the same n nodes
and share the graph. Every function here is plain numpy (no Flower); the
strategies ``kcagc`` / ``kcagc-basic`` only move their inputs and outputs. This is
the paper's protocol (``kcagc.mode = paper``, and ``kcagc-basic``); the default exact
mode's math is :mod:`fedgraphcore.protocols.kcagc.exact`.

Per party (Protocol 1, local):
  * :func:`embedding` - AGC filter ``G = (I + D~^-1/2 (A+I) D~^-1/2) / 2``
    (or the paper's Appendix E.2 filter ``I - L_s / ||L_s||``, ``filter_kind``)
    applied ``psi`` times to ``X^l``, then (default ``"projection-unit"``) the
    projection of the filtered block on its top ``d`` right singular vectors,
    ``U^l S^l = G^psi X^l V V'`` in the basis V (the paper's "project onto
    the top singular vectors"), with every row scaled to unit length (``Z^l``,
    n x d). Other choices: ``"projection"`` (``U^l S^l``, rows as they are),
    ``"normalized"`` (``U^l`` with unit rows), ``"svd"`` (``U^l`` itself:
    exactly AGC's embedding for ``d = k``), ``"filtered"`` (``G^psi X^l``),
    ``"projection-joint-unit"`` (``U^l S^l`` divided by the node's norm over
    all parties, :func:`joint_unit_rows`: the concatenation has unit rows),
    ``"projection-mixed-unit"`` (divided by ``||U^l_i S^l||^beta J_i^(1-beta)``
    with ``J_i`` the node's joint norm: beta = 1 is ``projection-unit``,
    beta = 0 ``projection-joint-unit``).
    Why rows are normalised: with unscaled ``U^l S^l`` k-means on Cora falls
    to 52-58%; with ``"svd"`` each party's block is whitened separately, and
    a node whose filtered block is small (few of this party's words) gets a
    short, noisy row that dominates the concatenation of many narrow blocks
    (Cora L=16: 58% vs 67.5% at L=2). Unit rows weigh every party equally per
    node (cosine geometry, as in Ng-Jordan-Weiss spectral clustering); keeping
    ``S`` (not whitening, as ``"normalized"`` does) measured 1-4 points better
    on Cora and CiteSeer; docs/results/kcagc.md, "Per-party embedding", compares them.
    Per-party unit rows weigh an uninformative narrow block as much as an
    informative one; the joint scaling weighs each party by its share of the
    node's norm instead, at the price of one secure sum of the n squared row
    norms, whose total every party then learns. The mixed scaling sits in
    between: party l's block of node i has length ``(||P^l_i|| / J_i)^(1-beta)``.
  * :func:`local_clusters` - k-means (k-means++ seeding, restarts; the
    paper's "10-approximation") of ``Z^l`` into ``k_hat`` local clusters;
    optionally with Protocol 1's pruning rule (:func:`prune`).

Server (Protocol 3, lines 4-10):
  * :func:`intersect` - the virtual nodes: the non-empty intersections of the
    parties' local clusters (node -> virtual node index, weights = sizes).
  * :func:`tree_groups` - the binary-tree arrangement of parties.

Per party, on the virtual nodes:
  * :func:`virtual_block` - party l's block of every virtual node: the mean of
    its members' ``Z^l`` rows (``y_v^l``).
  * :func:`partial_distances` - ``D^l[r, v, j] = ||y_v^l - mu_{r,j}^l||^2``,
    party l's part of each squared distance; the full distance is the sum
    over parties (the only thing the server learns, by secure aggregation).
    :func:`point_distances` is the same for a list of centres (``P x m``):
    what a party uploads for the centres that moved (their restarts:
    :func:`moved_restarts`).
  * :func:`update_centres` - weighted means of the virtual nodes of each
    cluster (``mu_j^l = sum_{a(v)=j} w_v y_v^l / sum_{a(v)=j} w_v``); an
    empty cluster keeps its centre.

Server, on the summed distances:
  * :func:`assign` - nearest centre and weighted inertia per restart.
  * :func:`moved_centres` - the centres whose member set changed: the only
    ones whose distances change in the next Lloyd round.
  * :func:`seeding_step` - one step of weighted k-means++ seeding
    (probability of a virtual node proportional to ``w_v * min_j D[v, j]``).
  * :func:`prune` - Protocol 1 line 10 / Protocol 2 line 17 (optional): after
    seeding, only points with ``D[v, r] <= D[v, s] / 9`` for all ``s != r``
    join cluster r for the first centre update (the others get -1).

With every node its own virtual node (``kcagc-basic``, Protocol 2) the same
loop is Lloyd's algorithm on the concatenation ``[Z^1, ..., Z^L]``.

Wire protocol of ``kcagc.mode = paper`` and of ``kcagc-basic``:

``kcagc`` only - 1. ``kcagc_local`` (down: k_hat, filter/embedding settings,
   seed) -> up: ``labels`` (n int64): the local cluster of every node, i.e.
   the node-ID set of each of the client's k_hat local clusters. The client
   filters its columns (AGC's filter or the paper's spectral-norm filter,
   ``kcagc.filter``, order psi), projects the filtered block on
   its top-k singular vectors and scales the rows to unit length
   (``kcagc.embedding``; see ``fedgraphcore.protocols.kcagc``) and runs k-means++ / Lloyd locally (optionally
   with Protocol 1's 1/9 pruning, ``kcagc.prune``). Nothing else about its
   features leaves it: with AGC's adaptive filter order the client picks psi
   from its own features and does not report it (``metrics["filter_order"]``
   then says so).

``projection-joint-unit`` / ``projection-mixed-unit`` embeddings only, before
   step 1 (kcagc) or 3 (kcagc-basic) - ``kcagc_joint``: stage ``sum`` (down:
   filter/embedding settings) -> up ``s`` (uint64, masked): the client's
   squared row norms (n); the server unmasks only their sum over all clients
   and sends it back (stage ``scale``, down ``sq_norms``, n) so that every
   client scales its rows with the joint norm. The server and every client
   learn these n sums (a client, the sum over the others); nothing else.

2. The server intersects the local clusters into virtual nodes (a node's
   virtual node = the tuple of its local clusters; weight = member count),
   numbered by their smallest node ID, so that the ``members`` every client
   receives in step 3 give it the intersection of all local clusterings as a
   partition of the nodes, not which cluster of another client a part came from.
   ``kcagc-basic`` uses every node as its own virtual node (weight 1).

3. Weighted k-means on the virtual nodes, distances only under secure
   aggregation (``kcagc_step``; pairwise masks set up once, two rounds;
   with a single client there is nothing to mask and its distances, the
   sum itself, go up in clear):

   * seeding (k-means++, ``kcagc.restarts`` independent seedings run side by
     side in the same messages): down ``members`` (n, the virtual node of
     every node; first message only) and ``index`` (R, the newest seed of
     each restart) -> up ``d`` (masked): the client's part of the
     squared distance of every virtual node to each new seed (R x m). The
     server unmasks only the sum over clients and samples the next seed.
   * Lloyd: down ``moved`` (the P centres, flat restart x centre indices,
     whose distances the server lacks) with ``seeds`` (R x kk, first
     iteration) or ``assign`` (A x m, int8 up to 128 clusters: the clusters of the A <= R restarts
     those centres belong to, i.e. whose assignment changed) -> the client
     sets / updates its block of those restarts' centres (weighted means of
     its block of the virtual nodes) and uploads ``d`` (masked): its
     part of the squared distance of every virtual node to every moved
     centre (P x m; first iteration: the last seed of each restart, R x m,
     since the seeding rounds summed the distances to the other seeds). The
     server keeps the sums of the unmoved centres from earlier rounds,
     learns the summed distances, assigns each virtual node to the nearest
     centre and broadcasts the assignment (with ``kcagc.prune``, the first
     assignment leaves out (-1) virtual nodes not 9x closer to their nearest
     seed than to any other, Protocol 2 line 17). One message round per iteration;
     at most ``kcagc.iterations`` (Q) updates, fewer when every restart's
     assignment repeats. The restart with the smallest weighted inertia wins.

   With ``kcagc.tree`` the parties sit at the leaves of a binary tree: each
   level runs step 3 for all its internal nodes in the same messages, one
   secure sum per internal node among its own clients (``group``: a client
   masks with its group's members only and uploads only its group's part),
   each internal node re-clustering the intersection of its children's
   clusters into k_hat clusters, the root into k. The server then learns the
   summed distances of every group (e.g. of each pair of clients at level 1;
   with an odd number of clients the last three form one group, so that no
   client is ever alone), not only of all clients (ledger entry
   ``kcagc:tree-group-sums``). Each client masks only within the groups
   :func:`fedgraphcore.protocols.kcagc.tree_groups` defines and refuses any other.

   Masked distances travel in the 32-bit ring (uint32) with the unit-row
   embeddings, whose parts are provably at most 4, else in the 64-bit ring
   (``secagg.bound``); the decoded sums are the same (``fedgraphcore.privacy.secagg``).
   Each sum uses the finest power-of-two fixed-point scale its ring allows
   for that bound and the number of clients (never coarser than
   ``secagg.scale``; ``metrics["secagg_scale"]``): 2^27 with two clients in
   the 32-bit ring, 2^24 with sixteen.

4. ``labels`` (down: the final cluster of every node) -> the clients keep it.

The server never sees a client's features, centres or individual distances:
only node-ID sets of local clusters, and sums over all clients (tree variant:
over each group of at least two clients). Every client learns the intersection
of all clients' local clusterings (``members``: which nodes share a virtual
node, as Protocol 3's centre blocks need), every restart's assignment of the
virtual nodes in every Lloyd round, and the final labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigView, setting
from fedgraphcore.graph_filters import FILTERS
from fedgraphcore.protocols.kcagc.exact import MODES
from fedgraphcore.wire import ArraySpec, ReplySpec

# -- wire: the protocol's steps and what a valid reply holds ------------------------------
KCAGC_LOCAL = "kcagc_local"
KCAGC_STEP = "kcagc_step"
KCAGC_JOINT = "kcagc_joint"

#: A reply that only acknowledges (``kcagc_joint`` stage ``scale``, the final ``labels``).
RECEIVED_REPLY = ReplySpec(values=("received",))


def local_reply(n: int) -> ReplySpec:
    """``labels``: the local cluster of each of the ``n`` nodes (checked against k_hat by the server)."""
    return ReplySpec(arrays={"labels": ArraySpec((n,), kind="iu")})


def masked_reply(name: str, size: int, secure: bool) -> ReplySpec:
    """Array ``name`` of ``size`` values: the client's part of a sum, masked integers when ``secure``
    (``kcagc_joint`` stage ``sum``: ``s``, n squared row norms; ``kcagc_step``: ``d``, distances)."""
    return ReplySpec(arrays={name: ArraySpec((size,), kind="u" if secure else "f", masked=secure)})


# -- run-config keys ------------------------------------------------------------------------
EMBEDDINGS = ("normalized", "svd", "projection", "projection-unit", "filtered", "projection-joint-unit",
              "projection-mixed-unit")


@dataclass(frozen=True)
class KCAGCConfig(ConfigView):
    """The ``kcagc.*`` keys of :class:`strategies.kcagc.KCAGC` and its client (``kcagc-basic`` reads
    all but ``mode``, ``local_factor``, ``local_restarts`` and ``tree``; ``mode = exact``
    reads ``filter`` and ``filter_order`` only, :mod:`fedgraphcore.protocols.kcagc.exact`), declared here."""

    prefix: ClassVar[str] = "kcagc"
    mode: str = setting("exact", "kcagc: exact = centralised AGC's labels (top-k eigenvectors of F F^T, F = [G^psi "
                        "X^1 .. G^psi X^L], by block Krylov on secure sums of the clients' F_l (F_l^T Y), k-means on "
                        "the server); paper = the paper's Protocol 3 (local clusters, virtual nodes, secure weighted "
                        "k-means)", choices=MODES, primary=True)
    filter: str = setting("agc", "graph filter G = I - L_s / c on the self-looped normalised Laplacian: agc = AGC's "
                          "(c = 2), spectral-norm = the paper's Appendix E.2 filter (c = ||L_s||)",
                          choices=FILTERS, primary=True)
    filter_order: int = setting(0, "filter order psi; 0 = the paper's value (agc: cora 9, citeseer 15, pubmed 60, "
                                "wiki 2; spectral-norm: cora 5, citeseer 5), AGC's adaptive rule on other datasets; "
                                "-1 = adaptive (paper mode: per client on its own columns; exact mode: on all "
                                "columns, as AGC)", low=-1, high=1000, primary=True)
    local_factor: int = setting(1, "kcagc: local clusters per client k_hat = factor x k (paper: 1, 2, 4, 8; capped "
                                "at n)", low=1, high=10**7)
    embedding: str = setting("projection-unit", "client features from the filtered block G^psi X: projection-unit = "
                             "its projection U S on the top singular vectors with unit rows, projection = U S (the "
                             "paper's literal projection), normalized = U with unit rows, svd = U (AGC), filtered = "
                             "G^psi X, projection-joint-unit = U S divided by the node's norm J over all clients "
                             "(one secure sum of the n squared row norms, revealed to all), projection-mixed-unit = "
                             "U S divided by |U S|^beta J^(1-beta) (the same secure sum; beta = kcagc.mix-exponent)",
                             choices=EMBEDDINGS, primary=True)
    mix_exponent: float = setting(0.5, "projection-mixed-unit: exponent beta of a row's own norm in its divisor "
                                  "|U S|^beta J^(1-beta) (1 = projection-unit, 0 = projection-joint-unit)",
                                  low=0.0, high=1.0)
    embed_dim: int = setting(0, "singular vectors d per client (every embedding except filtered; capped at the "
                             "client's number of feature columns); 0 = k", low=0, high=10**6)
    iterations: int = setting(10, "Lloyd iterations Q (stops earlier when assignments repeat)", low=0, high=10**4)
    restarts: int = setting(50, "k-means++ seedings run side by side (same messages); the lowest weighted inertia "
                            "wins", low=1, high=1000)
    local_restarts: int = setting(10, "k-means++ restarts of each client's local clustering", low=1, high=1000)
    tree: bool = setting(False, "kcagc: binary-tree arrangement of the clients (for many clients)")
    prune: bool = setting(False, "Protocol 1's 1/9 rule: the first centres after seeding are the means of the points "
                          "at least 9x closer (squared) to their seed than to any other (local and secure k-means)")


#: Filter order psi the kCAGC paper fixes per graph filter (fedgraphcore.graph_filters.FILTERS) and dataset:
#: AGC's filter in Section 4.1 (Table II), the spectral-norm filter in Appendix E.2 (Tables VIII, IX).
PAPER_ORDER = {"agc": {"cora": 9, "citeseer": 15, "pubmed": 60, "wiki": 2},
               "spectral-norm": {"cora": 5, "citeseer": 5}}

#: Embeddings whose rows are scaled with the parties' summed squared row norms
#: (one secure sum of n values before clustering, :func:`joint_unit_rows`).
JOINT_EMBEDDINGS = ("projection-joint-unit", "projection-mixed-unit")

#: Embeddings with unit rows on every party (a zero row stays zero). Virtual
#: nodes and centres are weighted means of rows, so they lie in the unit ball
#: and one party's part of any squared distance is at most (1 + 1)^2 = 4.
UNIT_ROW_EMBEDDINGS = ("normalized", "projection-unit")

#: That bound plus room for float rounding: the secure sums of these
#: embeddings' distances fit the 32-bit ring (fedgraphcore.privacy.secagg) at a
#: fixed-point scale up to 2^31 / (bound * parties), 2^27 for two parties.
UNIT_ROW_DISTANCE_BOUND = 4.0 + 1e-9


def distance_bound(kind: str, configured: float) -> float:
    """Largest part of a squared distance that one party may contribute to a
    secure sum: ``configured`` (``secagg.bound``), or the smaller proved bound
    of a unit-row embedding."""
    return min(configured, UNIT_ROW_DISTANCE_BOUND) if kind in UNIT_ROW_EMBEDDINGS else configured


#: Protocol 1's pruning ratio: a point is confident if its squared distance to
#: the nearest seed is at most 1/9 of that to any other seed.
PRUNE_RATIO = 1.0 / 9.0


def filter_order(dataset: str, configured: int, kind: str = "agc") -> int | None:
    """The filter order psi to use: ``configured`` if > 0; for 0 the paper's
    value for graph filter ``kind`` on that dataset (:data:`PAPER_ORDER`);
    ``None`` (AGC's adaptive rule) otherwise (``configured`` < 0, or 0 on a
    dataset the paper gives no order for)."""
    from fedgraphcore.graph_filters import check_filter

    check_filter(kind)
    if configured > 0:
        return int(configured)
    if configured == 0 and dataset in PAPER_ORDER[kind]:
        return PAPER_ORDER[kind][dataset]
    return None


def embedding(x, adj, dim: int, order: int | None, seed: int, kind: str = "projection-unit",
              k_adaptive: int | None = None, filter_kind: str = "agc") -> tuple[np.ndarray, int]:
    """Party-local features ``Z^l`` (n x dim) and the filter order used.

    ``kind``: ``"normalized"`` top-``dim`` left singular vectors of
    ``G^psi X^l`` with unit rows (a zero row stays zero); ``"svd"`` the
    singular vectors themselves (AGC, :func:`fedgraphcore.graph_filters.agc_embedding`);
    ``"projection"`` ``U S`` (coordinates of the projection on the top-``dim``
    right singular vectors); ``"projection-unit"`` ``U S`` with unit rows; ``"filtered"`` ``G^psi X^l`` (``dim`` ignored);
    ``"projection-joint-unit"`` / ``"projection-mixed-unit"`` ``U S`` as it
    is: this party's part before :func:`joint_unit_rows` scales it with the
    joint row norms.
    ``order=None`` picks psi by AGC's adaptive rule on this party's own
    columns (:func:`fedgraphcore.graph_filters.agc` with ``k_adaptive`` clusters).
    ``filter_kind``: the graph filter G (``fedgraphcore.graph_filters.FILTERS``).
    """
    from fedgraphcore.graph_filters import agc, low_pass_filter

    if kind not in EMBEDDINGS:
        raise ValueError(f"unknown embedding {kind!r}; valid choices: " + ", ".join(EMBEDDINGS))
    if order is None:
        _, order = agc(x, adj, int(k_adaptive or dim), seed, order=None, n_init=3, kind=filter_kind)
    if kind == "filtered":
        return low_pass_filter(x, adj, order, filter_kind), order
    dim = int(min(dim, x.shape[1], x.shape[0]))
    u, s = top_singular(x, adj, dim, order, seed, filter_kind)
    if kind == "projection" or kind in JOINT_EMBEDDINGS:
        return u * s, order
    if kind in ("normalized", "projection-unit"):
        rows = u if kind == "normalized" else u * s
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return rows / np.where(norms > 0, norms, 1.0), order
    return np.asarray(u), order


#: A party with at most this many columns per singular vector takes the exact
#: SVD of its dense filtered block (via the f x f Gram matrix) instead of the
#: implicit one: with many parties each block is narrow (Wiki, L=16: 311
#: columns) and the exact route is faster there; wide blocks keep the Lanczos
#: SVD of :func:`fedgraphcore.graph_filters.agc_singular`, which never forms the dense n x f block.
DENSE_COLUMNS_PER_VECTOR = 40


def top_singular(x, adj, dim: int, order: int, seed: int, filter_kind: str = "agc") -> tuple[np.ndarray, np.ndarray]:
    """Top-``dim`` left singular vectors and values of ``G^order X`` (this party's block)."""
    from fedgraphcore.graph_filters import agc_singular, low_pass_filter

    if x.shape[1] > DENSE_COLUMNS_PER_VECTOR * dim:
        return agc_singular(x, adj, dim, order, seed, filter_kind)
    f = low_pass_filter(x, adj, order, filter_kind)
    eigval, eigvec = np.linalg.eigh(f.T @ f)
    top = np.argsort(eigval)[::-1][:dim]
    s = np.sqrt(np.maximum(eigval[top], 0.0))
    u = (f @ eigvec[:, top]) / np.where(s > 0, s, 1.0)
    return u, s


def local_clusters(z: np.ndarray, k_hat: int, seed: int, n_init: int = 10, pruned: bool = False) -> np.ndarray:
    """Party-local k-means (k-means++ seeding, ``n_init`` restarts) into ``k_hat`` clusters.

    ``pruned``: Protocol 1 as written - per restart, k-means++ seeds, the first
    centres are the means of the seeds' confident points (:func:`prune`), then
    Lloyd; the restart with the lowest inertia wins. ``k_hat >= n`` makes
    every node its own local cluster.
    """
    from fedgraphcore.clustering import kmeans

    n = z.shape[0]
    if k_hat >= n:
        return np.arange(n, dtype=np.int64)
    if not pruned:
        return kmeans(z, int(k_hat), seed, n_init=n_init)
    from sklearn.cluster import kmeans_plusplus

    best, best_inertia = None, np.inf
    weights = np.ones(n)
    for r in range(int(n_init)):
        # one seeding stream per restart, within sklearn's random_state range [0, 2**32 - 1]
        seeds, _ = kmeans_plusplus(z, int(k_hat), random_state=(int(seed) * 1000 + r) % 2**32)
        first = prune(partial_distances(z, seeds[None])[0])
        init = update_centres(z, weights, first[None], seeds[None])[0]
        labels, centres = kmeans(z, int(k_hat), seed, init=init, return_centers=True)
        inertia = float(((z - centres[labels]) ** 2).sum())
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def intersect(labels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Virtual nodes from the parties' local clusterings (Protocol 3, lines 4-10).

    ``labels[l][i]`` is node i's local cluster at party l. Returns
    ``(members, weights)``: ``members[i]`` the index of node i's virtual node
    (the intersection of its local clusters; only non-empty intersections
    exist) and ``weights[v]`` its member count.

    Every party receives ``members``, so the virtual nodes are numbered by
    their smallest node ID: a numbering that depends on the partition only.
    Numbered by the label tuples instead, the order of the IDs would tell a
    party how the others labelled their clusters, and with it their local
    clusterings.
    """
    if not labels:
        raise ValueError("no local clusterings to intersect")
    n = len(labels[0])
    if any(len(a) != n for a in labels):
        raise ValueError(f"local clusterings cover different numbers of nodes: {[len(a) for a in labels]}")
    key = np.stack([np.asarray(a, dtype=np.int64) for a in labels], axis=1)
    _, first, members, weights = np.unique(key, axis=0, return_index=True, return_inverse=True,
                                           return_counts=True)
    order = np.argsort(first)  # virtual nodes by smallest member
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[members.ravel()].astype(np.int64), weights[order].astype(np.float64)


def joint_unit_rows(z: np.ndarray, joint_squared_norms: np.ndarray, own_exponent: float = 0.0) -> np.ndarray:
    """Party l's rows scaled with the node's norm over all parties:
    ``Z^l_i / (||Z^l_i||^beta * J_i^(1 - beta))`` with ``J_i = sqrt(sum_l' ||Z^l'_i||^2)``
    and ``beta = own_exponent``; ``joint_squared_norms`` is ``J^2`` (the secure sum
    of every party's ``(Z^l ** 2).sum(1)``). ``beta = 0`` gives the concatenation
    over parties unit rows (``projection-joint-unit``); ``beta = 1`` gives every
    party's block unit rows (``projection-unit``); in between, a block's length
    is ``(||Z^l_i|| / J_i)^(1 - beta)`` (``projection-mixed-unit``). A zero row stays zero."""
    total = np.asarray(joint_squared_norms, dtype=np.float64)
    if total.shape != (z.shape[0],) or not np.all(np.isfinite(total)):
        raise ValueError(f"joint squared norms must be {z.shape[0]} finite values, got shape {total.shape}")
    beta = float(own_exponent)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"own_exponent={own_exponent} is outside [0, 1]")
    joint = np.sqrt(np.maximum(total, 0.0))
    own = np.linalg.norm(z, axis=1)
    scale = np.where(own > 0, own, 1.0) ** beta * np.where(joint > 0, joint, 1.0) ** (1.0 - beta)
    return z / scale[:, None]


def _indicator(members: np.ndarray, m: int) -> sp.csr_matrix:
    n = len(members)
    return sp.csr_matrix((np.ones(n), (members, np.arange(n))), shape=(m, n))


def virtual_block(z: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Party l's block of the virtual nodes: ``y_v^l = mean_{i: members[i]=v} Z^l_i`` (m x d)."""
    members = np.asarray(members, dtype=np.int64)
    m = int(members.max()) + 1 if len(members) else 0
    counts = np.bincount(members, minlength=m).astype(np.float64)
    if np.any(counts == 0):
        raise ValueError("virtual node indices must be 0..m-1 with every index used")
    return np.asarray(_indicator(members, m) @ z) / counts[:, None]


def partial_distances(y: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``D[r, v, j] = ||y_v - centres[r, j]||^2`` on this party's columns.

    ``y``: m x d, ``centres``: R x kk x d (one set per restart) -> R x m x kk.
    """
    R, kk, dim = centres.shape
    return point_distances(y, centres.reshape(R * kk, dim)).reshape(R, kk, len(y)).transpose(0, 2, 1)


def point_distances(y: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``D[p, v] = ||y_v - points_p||^2`` on this party's columns: P x d points -> P x m."""
    return np.maximum(
        np.einsum("vd,vd->v", y, y)[None, :] - 2.0 * points @ y.T + np.einsum("pd,pd->p", points, points)[:, None],
        0.0,
    )


def seed_distances(y: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Partial squared distances of every virtual node to the virtual nodes ``index`` (R,) -> R x m."""
    return point_distances(y, y[np.asarray(index, dtype=np.int64)])


def moved_centres(before: np.ndarray, after: np.ndarray, kk: int) -> np.ndarray:
    """Flat indices ``r * kk + j`` of the centres whose member set differs between two
    assignments (R x m, -1 = left out): the only centres a Lloyd update moves.

    A centre is the weighted mean of its members, so a centre with the same
    members stays where it is, and so do its distances to every virtual node.
    """
    changed = before != after
    rows = np.nonzero(changed)[0]
    mark = np.zeros((len(before), kk + 1), dtype=bool)  # column 0: left out (-1)
    mark[rows, before[changed] + 1] = True
    mark[rows, after[changed] + 1] = True
    return np.flatnonzero(mark[:, 1:]).astype(np.int64)


def moved_restarts(moved: np.ndarray, kk: int) -> np.ndarray:
    """The restarts (sorted) that have a centre among the flat indices ``moved`` (``r * kk + j``)."""
    return np.unique(np.asarray(moved, dtype=np.int64) // kk)


def update_centres(y: np.ndarray, weights: np.ndarray, assignment: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Weighted means per cluster for every restart; empty clusters keep their centre.

    ``assignment``: R x m cluster indices, -1 = left out (pruned);
    ``centres``: R x kk x d (previous).
    """
    R, kk, _ = centres.shape
    out = centres.copy()
    for r in range(R):
        keep = np.flatnonzero(assignment[r] >= 0)
        a, wk = assignment[r][keep], weights[keep]
        w = np.bincount(a, weights=wk, minlength=kk)
        sums = np.asarray(sp.csr_matrix((wk, (a, keep)), shape=(kk, len(assignment[r]))) @ y)
        nonempty = w > 0
        out[r, nonempty] = sums[nonempty] / w[nonempty, None]
    return out


def assign(distances: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre per restart and the weighted inertia ``sum_v w_v min_j D[r, v, j]``.

    ``distances``: R x m x kk (summed over parties) -> (R x m int64, R floats).
    """
    a = distances.argmin(axis=2)
    best = np.take_along_axis(distances, a[:, :, None], axis=2)[:, :, 0]
    return a.astype(np.int64), (np.maximum(best, 0.0) * weights[None, :]).sum(axis=1)


def prune(distances: np.ndarray) -> np.ndarray:
    """Protocol 1 line 10: the nearest centre where it is at least 9 times closer
    (squared) than every other centre, else -1. ``distances``: ... x m x kk."""
    order = np.sort(distances, axis=-1)
    nearest = distances.argmin(axis=-1)
    confident = order[..., 0] <= PRUNE_RATIO * order[..., 1] if distances.shape[-1] > 1 else True
    return np.where(confident, nearest, -1).astype(np.int64)


def first_seeds(weights: np.ndarray, restarts: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ first centre of each restart: a virtual node with probability proportional to its weight."""
    p = weights / weights.sum()
    return rng.choice(len(weights), size=restarts, p=p).astype(np.int64)


def seeding_step(closest: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Next k-means++ centre of each restart (R,) from the squared distance of every
    virtual node to its nearest chosen centre (``closest``: R x m)."""
    out = np.empty(closest.shape[0], dtype=np.int64)
    for r, d in enumerate(closest):
        p = np.maximum(d, 0.0) * weights
        total = p.sum()
        if total <= 0:  # every virtual node already coincides with a centre
            p = weights
            total = p.sum()
        out[r] = rng.choice(len(p), p=p / total)
    return out


def tree_groups(num_parties: int) -> list[list[list[int]]]:
    """Binary-tree levels: each level is a list of groups of party ids.

    Level 0 is every party alone; level 1 pairs neighbouring parties, the last
    three together when their number is odd; each next level merges
    neighbouring groups (an odd group out moves up unchanged) until one group
    holds all parties. No party is ever alone above level 0: the sums of a
    group and of its children would otherwise differ by that party's part.
    """
    levels = [[[p] for p in range(num_parties)]]
    if num_parties > 1:
        pairs = [[p, p + 1] for p in range(0, num_parties - 1, 2)]
        if num_parties % 2:
            pairs[-1].append(num_parties - 1)
        levels.append(pairs)
    while len(levels[-1]) > 1:
        prev = levels[-1]
        levels.append([sum(prev[i:i + 2], []) for i in range(0, len(prev), 2)])
    return levels
