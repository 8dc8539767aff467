"""FedAvg + DMoN on a node split with boundary edges: the whole graph's GCN layer and loss.

The paper's federated mode (:mod:`fedgraphcore.protocols.fedavg_dmon`) trains every party on its own
subgraph: the edges between parties are lost, both to the GCN layer and to the modularity
loss. On a node split with boundary edges (``partition.boundary=true``: each party also knows
its nodes' edges to other parties' nodes) the parties train on the whole graph instead, with
two padded sums (:mod:`fedgraphcore.protocols.boundary`) and one secure sum; the server learns no edge,
no feature and no assignment of a node.

Notation: ``A`` the whole graph's training adjacency (the global edge split of
:func:`fedgraphcore.protocols.fedavg_dmon.edge_split_codes` applied to cut edges too: both ends' parties
compute the same code), ``d = A 1``, ``2m = 1'd``, ``D~ = diag(d + 1)``, n the number of nodes,
party c's rows ``S_c`` of the soft assignments, ``B_c`` its column block of ``A`` (``A H =
sum_c B_c H_c``).

**First layer, once.** DMoN's GCN layer is ``H = SELU(A_hat X W_1 + b_1)`` with ``A_hat = D~^-1/2
(A + I) D~^-1/2``, and ``A_hat X W_1 = (A_hat X) W_1``: the product with the graph does not
depend on the weights. Row i of ``A_hat X`` is ::

    (A_hat X)_i = d~_i^-1/2 ( sum_j A_ij d~_j^-1/2 X_j  +  d~_i^-1/2 X_i )

so one padded sum of ``F_c = D~_c^-1/2 X_c`` (:func:`feature_share`) gives every party
``(A D~^-1/2 X)_c``, its nodes' sums over all their neighbours, and it forms its rows
``P_c = (A_hat X)_c`` (:func:`propagated`) and keeps them. Training then runs the same
:class:`fedgraphcore.models.DMoNModel` on ``P_c`` with an empty edge list: ``GCNConv`` adds unit
self-loops, so its propagation is the identity and the layer computes ``P_c W_1' + b_1``,
the centralised layer's rows. The model is now row-wise: ``S_i`` depends on ``P_i`` and
the weights only.

**Loss, every round.** The whole graph's DMoN loss (:func:`fedgraphcore.models.dmon_loss`) is ::

    L(S) = -(1/2m) ( Tr(S'AS) - ||S'd||^2 / 2m )  +  lambda ( sqrt(k)/n ||sum_i S_i|| - 1 ).

Its gradient in party c's rows is ::

    dL/dS_i = -(1/2m) ( 2 (A S)_i - 2 d_i (S'd) / 2m )  +  lambda sqrt(k)/n  t / ||t||,   t = sum_j S_j,

which needs, besides the party's own rows, the other parties' rows only through
``N_i = sum_{j elsewhere} A_ij S_j``, ``g = sum_{j elsewhere} d_j S_j`` and
``u = sum_{j elsewhere} S_j`` (and 2m, n). At the start of round r every party computes
``S_c`` under the global weights ``W_r`` (eval mode: no dropout) and uploads a padded
``B_c S_c`` (every party gets ``(A S)_c``; :func:`frozen_terms` subtracts its own edges'
part, ``N_c = (A S)_c - A_cc S_c``) and a masked ``[S_c'd_c, sum_i S_c,i, ...]`` (the
secure sum gives ``S'd`` and ``t``; minus its own part, ``g`` and ``u``). Party c then
minimises (:func:`party_loss`) ::

    L_c(S_c) = -(1/2m) ( Tr(S_c' A_cc S_c) + 2 <S_c, N_c> - ||S_c'd_c + g||^2 / 2m )
               +  lambda ( sqrt(k)/n ||sum_i S_c,i + u|| - 1 ),

the whole-graph loss with every other party's rows frozen at the round start (less the
constant ``Tr(S_o' A_oo S_o)`` of the others' own edges). ``dL_c/dS_i = dL/dS_i`` for its
nodes at the round start, and every weight reaches the loss only through the rows, so ::

    sum_c grad_W L_c(W_r) = grad_W L(W_r):

the parties' gradients add up to the centralised one (as they do on a shared graph without
any cut edge, where ``N_c, g, u`` are 0 and ``L_c`` is the party's own DMoN loss). Within a
round the frozen terms go stale; the party's own block moves exactly. With one party
``L_c = L``. With ``fedavg-dmon.aggregate=gradient`` nothing goes stale: the server sums the
parties' gradients at ``W_t`` and takes the Adam step itself (:mod:`fedgraphcore.protocols.fedavg_dmon.gradient`).

**Model selection.** The validation modularity of the hard labels ``Y`` (one-hot) on the whole
graph's validation edges ``A^v`` (degrees ``d^v``, ``2m_v``) ::

    Q_v = (1/2m_v) ( sum_c sum_{i in c} (A^v Y)_{i, y_i}  -  ||Y'd^v||^2 / 2m_v )

rides on the same sums: the padded upload is ``B_c [S_c | Y_c]`` (``B`` of ``A`` and of
``A^v``), the masked vector adds ``Y_c'd^v_c`` and the volumes ``1'd_c``, ``1'd^v_c``; each party
then reports ``sum_{i in c} (A^v Y)_{i, y_i}`` (:func:`val_intra`, a count of validation-edge
ends inside clusters) and the server forms ``Q_v`` (:func:`validation_modularity`).

What a party learns: per node the sum of its neighbours' feature rows (once) and of their soft
assignments and one-hot labels under the global weights (every round): for a node with one
neighbour elsewhere, that neighbour's rows, as a centralised GCN would hand the node's owner.
The server and everyone learn the global sums ``S'd``, ``t``, ``Y'd^v``, 2m and 2m_v.

Wire protocol (``aggregate=weights``; with ``aggregate=gradient`` steps 1, 2 and 4 are shared and
step 3 is the server's Adam step on the summed gradients, :mod:`fedgraphcore.protocols.fedavg_dmon.gradient`)
after the boundary links (:func:`strategies.links.link_boundaries`; what leaves a
client in **bold**, every array masked):

1. ``query.dmon_features`` (once) -> **the padded ``B_c D~_c^-1/2 X_c``** (N x f ring); the
   server's ring sum is uniform to it (every party's pad on its own rows).
2. per round r: ``query.dmon_spread``. Down: ``W_r`` and ``k`` (round 1: with each party's rows
   of step 1's sum). Up: **the padded ``B_c [S_c | Y_c]``** (N x 2k) and **the masked
   ``[S_c'd_c, sum S_c, Y_c'd^v_c, 1'd_c, 1'd^v_c]``** (3k + 2) under ``W_r``: the server learns
   the summed vector (the whole graph's ``S'd``, cluster sizes, validation label volumes, 2m,
   2m_v), nothing per client.
3. per round r: ``train.dmon_train``. Down: each party's rows of step 2's padded sum and the
   summed vector. Up: **the trained weights** (masked with ``fedavg-dmon.secure``), **the local
   losses** and (``select=val-modularity``) **the validation count ``val_intra`` of W_r**; the
   server forms the whole graph's validation modularity of ``W_r`` and averages the weights
   (FedAvg by node count).
4. (``select=val-modularity``) a ``dmon_spread`` of the final weights, then ``query.dmon_eval``
   with the rows -> **val_intra**.

The bound of every masked upload is the largest power of two the clients announced with hello
(``magnitude``), at least ``secagg.bound``; sums use the finest fixed-point scale it allows.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedgraphcore.data.types import Boundary
from fedgraphcore.protocols import boundary as boundary_protocol
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

DMON_FEATURES = "dmon_features"
DMON_SPREAD = "dmon_spread"

#: the padded uploads and the masked vector (their ``secagg_values`` go down under ``sums.``)
FEATURES, SPREAD, SUMS = "features", "spread", "sums"
SUMS_VALUES = "sums."

#: hello in boundary mode: a power of two at least every entry the party will upload (its
#: ``secagg`` bound: the server takes the largest)
HELLO_MAGNITUDE = {"magnitude": ValueSpec(low=1.0)}
#: a party's validation count (train / eval reply): validation-edge ends inside clusters
VAL_INTRA = {"val_intra": ValueSpec(low=0.0)}


def boundary_run(config) -> bool:
    """Whether a run (its run config) trains on the whole graph: ``mode=federated`` on a node split
    (``node-*``; ``auto`` is ``node-random`` for this method) with ``partition.boundary``."""
    partitioner = str(config["partitioner"])
    node = partitioner == "auto" or partitioner.startswith("node-")
    return node and bool(config["partition.boundary"]) and str(config["fedavg-dmon.mode"]) == "federated"


def sums_width(k: int) -> int:
    """Length of the masked vector: ``S_c'd_c``, ``sum S_c``, ``Y_c'd^v_c`` (k each), ``1'd_c``, ``1'd^v_c``."""
    return 3 * k + 2


def spread_reply(total: int, k: int) -> ReplySpec:
    """``dmon_spread``: the padded ``B_c [S_c | Y_c]`` (N x 2k) and the masked sums vector."""
    return ReplySpec(arrays={SPREAD: ArraySpec((total, 2 * k), "u", masked=True),
                             SUMS: ArraySpec((sums_width(k),), "u", masked=True)})


def train_reply(shapes: dict, epochs: int, secure: bool, scored: bool) -> ReplySpec:
    """``dmon_train`` in boundary mode: the weights (one masked ring vector when ``secure``), the
    per-epoch local losses and, with ``scored``, the validation count of the round's weights."""
    numbers = {"losses": ValueSpec(length=epochs), **(VAL_INTRA if scored else {})}
    if secure:
        size = sum(int(np.prod(s)) for s in shapes.values())
        return ReplySpec(arrays={"weights": ArraySpec((size,), kind="u", masked=True)}, numbers=numbers)
    return ReplySpec(arrays={n: ArraySpec(shapes[n], kind="f") for n in fedavg_dmon.PARAM_NAMES}, numbers=numbers)


EVAL_REPLY = ReplySpec(numbers=VAL_INTRA)


# --------------------------------------------------------------------------- the edge split


def split_ids(keys: np.ndarray) -> np.ndarray:
    """Integers the edge split hashes for node IDs: integer IDs as they are, text IDs by the
    first 4 bytes of their BLAKE2b digest (both ends of a cut edge compute the same)."""
    keys = np.asarray(keys)
    if keys.dtype.kind in "iu":
        return keys.astype(np.int64)
    return np.array([int.from_bytes(hashlib.blake2b(str(k).encode(), digest_size=4).digest(), "little")
                     for k in keys.tolist()], dtype=np.int64)


@dataclass(frozen=True)
class Cut:
    """A party's share of the whole graph, split: its column blocks of the training and the
    validation adjacency (N x n_c) and its nodes' whole-graph degrees in both."""

    train: sp.csr_matrix
    val: sp.csr_matrix
    degrees: np.ndarray
    val_degrees: np.ndarray


def boundary_codes(boundary: Boundary, row_keys: np.ndarray, seed: int, val: float, test: float) -> np.ndarray:
    """TRAIN / VAL / TEST code of each boundary edge (the global split, as its other end's party computes)."""
    ids = split_ids(row_keys)
    return fedavg_dmon.edge_split_codes(ids[boundary.rows], split_ids(boundary.keys), seed, val, test)


def _part(boundary: Boundary, links: boundary_protocol.Links, keep: np.ndarray) -> tuple[Boundary, boundary_protocol.Links]:
    return (Boundary(boundary.rows[keep], boundary.keys[keep], boundary.weight[keep]),
            boundary_protocol.Links(links.offset, links.total, links.far[keep]))


def cut(adj_train: sp.csr_matrix, adj_val: sp.csr_matrix, boundary: Boundary, codes: np.ndarray,
        links: boundary_protocol.Links) -> Cut:
    """The party's :class:`Cut` from its split local adjacencies and its coded, linked boundary."""
    out = []
    for adj, code in ((adj_train, fedavg_dmon.TRAIN), (adj_val, fedavg_dmon.VAL)):
        part, where = _part(boundary, links, codes == code)
        out += [boundary_protocol.column_block(adj, part, where), boundary_protocol.degrees(adj, part)]
    return Cut(out[0], out[2], out[1], out[3])


def magnitude(x: np.ndarray, degrees: np.ndarray, n: int) -> float:
    """A power of two >= every entry of the party's uploads: ``B_c F_c`` (at most its volume
    times ``max |F_c|``), ``B_c S_c`` and ``S_c'd_c`` (at most its volume), ``sum S_c`` (n_c)."""
    volume = float(degrees.sum())
    largest = max(volume * float(np.abs(feature_share(x, degrees)).max(initial=0.0)), volume, float(n), 1.0)
    return float(2.0 ** math.ceil(math.log2(largest)))


# --------------------------------------------------------------------------- first layer


def feature_share(x, degrees: np.ndarray) -> np.ndarray:
    """``F_c = D~_c^-1/2 X_c`` (dense float64): what the party's padded upload multiplies."""
    x = x.toarray() if sp.issparse(x) else np.asarray(x, dtype=np.float64)
    return x / np.sqrt(degrees + 1.0)[:, None]


def propagated(neighbour_sums: np.ndarray, x, degrees: np.ndarray) -> np.ndarray:
    """``P_c = (A_hat X)_c = D~_c^-1/2 ((A D~^-1/2 X)_c + F_c)`` from the padded sum's rows."""
    return (neighbour_sums + feature_share(x, degrees)) / np.sqrt(degrees + 1.0)[:, None]


def propagation(adj: sp.csr_matrix, x) -> np.ndarray:
    """``A_hat X`` of a whole graph (the centralised GCN layer's product with the graph)."""
    degrees = np.asarray(adj.sum(axis=1), dtype=np.float64).ravel()
    return propagated(adj @ feature_share(x, degrees), x, degrees)


# --------------------------------------------------------------------------- the party's model and loss


@dataclass
class PartyGraph:
    """A party's tensors: ``x`` its propagated features ``P_c`` (float32), ``no_edges`` the empty edge
    list the GCN layer gets, its own training edges (both directions) and its nodes' whole degrees."""

    x: "object"
    no_edges: "object"
    edge_index: "object"
    edge_weight: "object"
    degrees: "object"

    @property
    def layer(self) -> fedavg_dmon.Graph:
        """What :func:`fedgraphcore.protocols.fedavg_dmon.assign` runs the model on (identity propagation)."""
        import torch

        return fedavg_dmon.Graph(self.x, self.no_edges, torch.zeros(0, dtype=torch.float32))


def party_graph(p: np.ndarray, adj_train: sp.csr_matrix, degrees: np.ndarray) -> PartyGraph:
    import torch

    from fedgraphcore.models import adj_to_edge_index

    ei, ew = adj_to_edge_index(adj_train, dtype=torch.float64)
    return PartyGraph(torch.as_tensor(np.asarray(p, dtype=np.float32)), torch.zeros((2, 0), dtype=torch.long),
                      ei, ew, torch.as_tensor(np.asarray(degrees, dtype=np.float64)))


@dataclass
class Frozen:
    """The other parties' terms at the round start: ``far`` (n_c x k) ``N_c``, ``degree_rest`` g,
    ``size_rest`` u (k each), and the whole graph's 2m and n."""

    far: np.ndarray
    degree_rest: np.ndarray
    size_rest: np.ndarray
    two_m: float
    n: int


def party_sums(s: np.ndarray, labels: np.ndarray, cut_: Cut) -> np.ndarray:
    """The masked vector's float values: ``[S_c'd_c, sum_i S_c,i, Y_c'd^v_c, 1'd_c, 1'd^v_c]``."""
    k = s.shape[1]
    label_degrees = np.bincount(labels, weights=cut_.val_degrees, minlength=k)
    return np.concatenate([cut_.degrees @ s, s.sum(axis=0), label_degrees,
                           [cut_.degrees.sum(), cut_.val_degrees.sum()]])


def spread_rows(s: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``[S_c | Y_c]`` (n_c x 2k): what the party's padded ``dmon_spread`` upload multiplies by its blocks."""
    return np.hstack([s, np.eye(s.shape[1])[labels]])


def spread_product(cut_: Cut, s: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``[B_c S_c | B^v_c Y_c]`` (N x 2k)."""
    rows = spread_rows(s, labels)
    k = s.shape[1]
    return np.hstack([cut_.train @ rows[:, :k], cut_.val @ rows[:, k:]])


def frozen_terms(neighbour_sums: np.ndarray, s: np.ndarray, adj_train: sp.csr_matrix, degrees: np.ndarray,
                 totals: np.ndarray, n: int) -> Frozen:
    """The :class:`Frozen` terms from the party's rows ``(A S)_c`` of the padded sum, its own ``S_c`` at the
    round start and the secure sum's ``totals`` (:func:`party_sums` summed over parties)."""
    k = s.shape[1]
    return Frozen(neighbour_sums - adj_train @ s, totals[:k] - degrees @ s, totals[k: 2 * k] - s.sum(axis=0),
                  float(totals[3 * k]), int(n))


def party_loss(s, g: PartyGraph, frozen: Frozen, collapse: float):
    """``L_c(S_c)`` (module docstring), in float64: the whole-graph DMoN loss with the other parties'
    rows frozen, less the constant of their own edges."""
    import torch

    s64 = s.to(torch.float64)
    k = s64.shape[1]
    src, dst = g.edge_index[0], g.edge_index[1]
    far = torch.as_tensor(frozen.far, dtype=torch.float64)
    intra = (g.edge_weight * (s64[src] * s64[dst]).sum(dim=1)).sum() + 2.0 * (s64 * far).sum()
    sd = g.degrees @ s64 + torch.as_tensor(frozen.degree_rest, dtype=torch.float64)
    two_m = frozen.two_m
    spectral = -(intra - (sd * sd).sum() / two_m) / two_m if two_m > 0 else s64.new_zeros(())
    sizes = s64.sum(dim=0) + torch.as_tensor(frozen.size_rest, dtype=torch.float64)
    return spectral + collapse * (sizes.norm() / frozen.n * math.sqrt(k) - 1.0)


def soft_assign(weights, g: PartyGraph, k: int, hidden: int) -> np.ndarray:
    """``S_c`` under ``weights`` in eval mode (no dropout), float64."""
    import torch

    model = fedavg_dmon.shared_model(g.x.shape[1], k, hidden, 0.0)
    fedavg_dmon.set_weights(model, weights)
    model.eval()
    with torch.no_grad():
        return model(g.x, g.no_edges).numpy().astype(np.float64)


def party_train(state: fedavg_dmon.LocalState, g: PartyGraph, frozen: Frozen, k: int, epochs: int, lr: float,
                hidden: int, dropout: float, collapse: float, weights, keep_optimizer: bool
                ) -> tuple[fedavg_dmon.LocalState, list[float]]:
    """``epochs`` full-batch Adam steps on :func:`party_loss` from ``weights`` (as
    :func:`fedgraphcore.protocols.fedavg_dmon.local_train`: Adam moments and dropout stream from ``state``)."""
    def body(model, opt):
        model.train()
        losses = []
        for _ in range(int(epochs)):
            opt.zero_grad()
            loss = party_loss(model(g.x, g.no_edges), g, frozen, collapse)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    return fedavg_dmon.train_from(state, weights, k, lr, hidden, dropout, keep_optimizer, body)


# --------------------------------------------------------------------------- validation


def val_intra(labels: np.ndarray, val_sums: np.ndarray) -> float:
    """``sum_{i in c} (A^v Y)_{i, y_i}``: the party's validation-edge ends inside clusters."""
    return float(val_sums[np.arange(labels.size), labels].sum()) if labels.size else 0.0


def validation_modularity(intras: list[float], totals: np.ndarray, k: int) -> float:
    """``Q_v`` from the parties' :func:`val_intra` and the secure sum's ``Y'd^v`` and ``2m_v``."""
    label_degrees, two_m = totals[2 * k: 3 * k], float(totals[3 * k + 1])
    if two_m <= 0:
        return 0.0
    return float((sum(intras) - float(label_degrees @ label_degrees) / two_m) / two_m)
