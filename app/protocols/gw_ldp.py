"""GW-LDP (Jin & Chen): FedAvg-trained GNN, LDP-encoded node embeddings and a
server-side Gromov-Wasserstein (GW) pairwise matrix between graphs.

Plain functions, no Flower (the transport is strategies/gw_ldp.py and
clients/gw_ldp.py):

* **Models** (:func:`build_model`): GCN (2 ``GCNConv`` layers, hidden 16) or
  GIN (5 ``GINConv`` layers, hidden 64, then two linear layers). Both end in
  per-node class scores ``z_v`` (``C`` = number of classes); the graph score is
  their mean (average pooling). The node embedding (:func:`node_embeddings`)
  is a softmax, so in ``[0, 1]`` (alpha = 0, beta = 1 as in the paper), of
  either the class scores (``"classes"``: ``n x C``) or the last
  message-passing layer's output (``"hidden"``: ``n x h``, h = 16 for GCN,
  64 for GIN; the paper's ``H in [alpha, beta]^(n x h)`` with h "the hidden
  dimension", Section 3.2).
* **Local training** (:func:`local_train`): ``E`` full-batch Adam epochs on the
  client's training graphs (graph classification: cross-entropy of the pooled
  score; k-hop subgraphs: cross-entropy of the centre node's score, the centre
  label being the subgraph's pseudo-label). :func:`fedavg` is the plain
  weighted average the strategy's Flower ``aggregate_arrayrecords`` computes
  (kept as the reference for tests).
* **BatchNorm statistics** (:func:`norm_input_moments`,
  :func:`pooled_norm_statistics`): after training, each BatchNorm layer's
  running mean and variance are set, layer by layer in forward order
  (:func:`norm_layers`), to those of the union of the clients' training-graph
  nodes, from the per-client moments ``[N_c, sum a, sum a^2]`` of the layer's
  input: the same statistics as if one client held every training graph.
* **LDP** (:func:`encode_graph`, paper Algorithm 1): the multi-bit encoder of
  :mod:`app.privacy.ldp` applied to the ``n x d`` embedding of one graph
  (d = h or C) with budget ``epsilon_g`` for the whole graph: each row gets
  ``epsilon_g / n`` and ``m = max(1, min(d, floor(epsilon_g / 2.18)))``
  sampled coordinates, so
  each sampled entry is an ``epsilon_g/(m n)``-randomised response exactly as
  in Algorithm 1 and the ``n m`` entries compose to ``epsilon_g``-LDP for the
  graph's embedding. Output: int8 codes in ``{-1, 0, +1}``, ``m`` non-zeros
  per row. The paper's default is ``epsilon_g = 1/|V|``.
* **GW** (:func:`gw_matrix`): per graph the Euclidean intra-distance matrix
  of the (encoded) embeddings (:func:`intra_distance`) or all-pairs shortest
  paths (:func:`shortest_path_matrix`, topology-only baseline GW_A), uniform
  node weights, ``ot.gromov.gromov_wasserstein2`` (square loss) for every
  pair, in a process pool.
* **Downstream**: SVC on the precomputed kernel ``exp(-gamma D)`` with C and
  gamma picked on the validation split (:func:`svc_select`); clustering of
  the graphs by spectral clustering of that affinity or k-medoids on ``D``
  (:func:`cluster_gw`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from app.privacy.ldp import default_m, multibit_encode
from app.wire import whole_number

# -- wire: the protocol's steps ------------------------------------------------------------
GW_DESCRIBE = "gw_describe"
GW_NORM = "gw_norm"
GW_EMBED = "gw_embed"
FIT = "fit"

MODELS = ("gcn", "gin")
EMBEDDING_LAYERS = ("classes", "hidden")
CLUSTERINGS = ("spectral", "kmedoids")
SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST = 0, 1, 2
FOLDS = 10
C_GRID = tuple(10.0**e for e in range(-7, 8))
GAMMA_GRID = tuple(2.0**e for e in range(-10, 11))


# --------------------------------------------------------------------------- features, splits


def node_features(graph, degree_dim: int) -> np.ndarray:
    """Dense float32 node features of one graph; graphs without features
    (IMDB-BINARY) get a one-hot of ``min(degree, degree_dim - 1)``."""
    if graph.x is not None:
        x = graph.x.toarray() if sp.issparse(graph.x) else np.asarray(graph.x)
        return x.astype(np.float32)
    deg = np.asarray(graph.adj.sum(axis=1)).ravel().astype(np.int64)
    out = np.zeros((graph.adj.shape[0], degree_dim), dtype=np.float32)
    out[np.arange(deg.size), np.minimum(deg, degree_dim - 1)] = 1.0
    return out


def split_items(n: int, seed: int, client: int, ratios=(0.7, 0.2, 0.1), fold: int = -1) -> np.ndarray:
    """Train/val/test split (codes 0/1/2) of ``n`` items, seeded per client.

    ``fold = -1``: a random split in ``ratios`` (7:2:1 by default), at least
    one training item when ``n >= 1``. ``fold`` in ``0..9``: ten-fold
    cross-validation of the same 7:2:1 shape: the items are permuted (seeded)
    and cut into ten near-equal chunks; chunk ``fold`` is the test set, the
    next two chunks (cyclically) the validation set, the other seven the
    training set, so the ten folds test every item exactly once.
    """
    rng = np.random.default_rng([int(seed), 8, int(client)])
    split = np.full(n, SPLIT_TRAIN, dtype=np.int8)
    perm = rng.permutation(n)
    if fold >= 0:
        if fold >= FOLDS:
            raise ValueError(f"fold {fold} out of range; valid: -1 (random split) or 0..{FOLDS - 1}")
        chunk = (np.arange(n) * FOLDS) // max(n, 1)   # chunk of each permuted position
        split[perm[chunk == fold]] = SPLIT_TEST
        split[perm[np.isin(chunk, [(fold + 1) % FOLDS, (fold + 2) % FOLDS])]] = SPLIT_VAL
        return split
    n_test = int(round(ratios[2] * n))
    n_val = int(round(ratios[1] * n))
    if n - n_test - n_val < 1:
        n_test = min(n_test, max(0, n - 1))
        n_val = max(0, n - 1 - n_test)
    split[perm[:n_val]] = SPLIT_VAL
    split[perm[n_val:n_val + n_test]] = SPLIT_TEST
    return split


# --------------------------------------------------------------------------- models


class torch_threads:
    """Context manager: run torch with ``n`` intra-op threads, then restore.

    The per-client models here are tiny; with the default thread pool on a
    shared 2-core machine one local step was measured 10x slower than with 1.
    """

    def __init__(self, n: int = 1):
        self.n = n

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)
        return False


def build_model(kind: str, in_dim: int, num_classes: int, seed: int):
    """GCN (2 layers, hidden 16) or GIN (5 layers, hidden 64 + 2 linear), seeded."""
    import torch
    from torch import nn
    from torch_geometric.nn import GCNConv, GINConv

    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; valid choices: " + ", ".join(MODELS))
    torch.manual_seed(int(seed))

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = 16
            self.conv1 = GCNConv(in_dim, self.hidden)
            self.conv2 = GCNConv(self.hidden, num_classes)

        def embed(self, x, edge_index):
            return torch.relu(self.conv1(x, edge_index))

        def forward(self, x, edge_index):
            h = nn.functional.dropout(self.embed(x, edge_index), 0.5, self.training)
            return self.conv2(h, edge_index)

    class GIN(nn.Module):
        def __init__(self, hidden=64, layers=5):
            super().__init__()
            self.hidden = hidden
            dims = [in_dim] + [hidden] * layers
            self.convs = nn.ModuleList(
                GINConv(nn.Sequential(nn.Linear(a, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                      nn.Linear(hidden, hidden)))
                for a in dims[:-1]
            )
            self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in dims[:-1])
            self.lin1 = nn.Linear(hidden, hidden)
            self.lin2 = nn.Linear(hidden, num_classes)

        def embed(self, x, edge_index):
            h = x
            for conv, norm in zip(self.convs, self.norms):
                h = torch.relu(norm(conv(h, edge_index)))
            return h

        def forward(self, x, edge_index):
            h = torch.relu(self.lin1(self.embed(x, edge_index)))
            h = nn.functional.dropout(h, 0.5, self.training)
            return self.lin2(h)

    return GCN() if kind == "gcn" else GIN()


def _shared(name: str) -> bool:
    """State entries that FedAvg shares: parameters and BatchNorm running
    statistics, not BatchNorm's step counter (unused with a fixed momentum)."""
    return not name.endswith("num_batches_tracked")


def get_weights(model) -> dict[str, np.ndarray]:
    """The model's shared state (see :func:`_shared`) as float32 numpy arrays, by name."""
    return {k: v.detach().cpu().numpy().astype(np.float32).copy()
            for k, v in model.state_dict().items() if _shared(k)}


def set_weights(model, weights: dict[str, np.ndarray]) -> None:
    import torch

    state = model.state_dict()
    missing = {k for k in state if _shared(k)} ^ set(weights)
    if missing:
        raise ValueError(f"weights do not match the model: {sorted(missing)}")
    model.load_state_dict({k: torch.as_tensor(np.asarray(weights[k])).reshape(state[k].shape) if _shared(k)
                           else state[k] for k in state})


def fedavg(weights: Sequence[dict[str, np.ndarray]], counts: Sequence[float]) -> dict[str, np.ndarray]:
    """Weighted average of the clients' weights by their sample counts."""
    total = float(sum(counts))
    if total <= 0:
        raise ValueError("fedavg: total sample count is 0")
    return {
        k: sum(np.asarray(w[k], dtype=np.float64) * (c / total) for w, c in zip(weights, counts)).astype(np.float32)
        for k in weights[0]
    }


@dataclass
class GraphBatch:
    """Block-diagonal batch of graphs for full-batch training."""

    x: "object"            # torch float tensor (total nodes x f)
    edge_index: "object"   # torch long tensor (2 x E)
    batch: "object"        # torch long tensor: graph index of each node
    offsets: np.ndarray    # first node of each graph (num_graphs + 1,)

    @property
    def num_graphs(self) -> int:
        return len(self.offsets) - 1


def make_batch(graphs, degree_dim: int) -> GraphBatch:
    import torch

    xs, edges, sizes = [], [], []
    start = 0
    for g in graphs:
        xs.append(node_features(g, degree_dim))
        coo = sp.coo_matrix(g.adj)
        edges.append(np.vstack([coo.row, coo.col]).astype(np.int64) + start)
        sizes.append(g.adj.shape[0])
        start += g.adj.shape[0]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return GraphBatch(
        x=torch.from_numpy(np.vstack(xs)) if xs else torch.zeros((0, 1)),
        edge_index=torch.from_numpy(np.hstack(edges)) if edges else torch.zeros((2, 0), dtype=torch.long),
        batch=torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)),
        offsets=offsets,
    )


def _scores(model, batch: GraphBatch, task: str, select: np.ndarray):
    """Scores of the selected graphs: mean of node scores (task "graph") or the
    centre node's score (task "centre": node 0 of each subgraph)."""
    import torch

    z = model(batch.x, batch.edge_index)
    if task == "centre":
        return z[torch.from_numpy(batch.offsets[:-1][select])]
    sums = torch.zeros((batch.num_graphs, z.shape[1]), dtype=z.dtype).index_add_(0, batch.batch, z)
    sizes = torch.from_numpy(np.diff(batch.offsets)).to(z.dtype).clamp(min=1)
    return (sums / sizes[:, None])[torch.from_numpy(select)]


def _norm_modules(model) -> dict:
    """The model's BatchNorm layers by name (registration order)."""
    import torch

    return {name: mod for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)}


def freeze_norm_statistics(model) -> None:
    """BatchNorm layers to eval mode: they normalise with their current running
    statistics and do not update them. Under DP training the statistics are
    data summaries that neither clipping nor noise covers, so they stay at the
    values the server sent (and go back unchanged)."""
    for mod in _norm_modules(model).values():
        mod.eval()


def norm_layers(model, in_dim: int) -> list[str]:
    """Names of the model's BatchNorm layers in the order a forward pass applies
    them (found by one pass over a two-node graph without edges); empty for GCN."""
    import torch

    order: list[str] = []
    hooks = [mod.register_forward_pre_hook(lambda _mod, _inp, name=name: order.append(name))
             for name, mod in _norm_modules(model).items()]
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((2, int(in_dim))), torch.zeros((2, 0), dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    return order


def norm_input_moments(model, batch: GraphBatch, select: np.ndarray, layer: str) -> np.ndarray:
    """Moments of BatchNorm layer ``layer``'s input ``a_v`` over the nodes v of
    the graphs ``select``, with the model in eval mode (every earlier BatchNorm
    layer normalises with its current running statistics):
    ``[N, sum_v a_v, sum_v a_v**2]`` (float64, length ``1 + 2h``)."""
    import torch

    norms = _norm_modules(model)
    if layer not in norms:
        raise ValueError(f"unknown BatchNorm layer {layer!r}; valid choices: " + ", ".join(norms))
    captured = []
    hook = norms[layer].register_forward_pre_hook(lambda _mod, inp: captured.append(inp[0].detach()))
    try:
        model.eval()
        with torch.no_grad():
            model(batch.x, batch.edge_index)
    finally:
        hook.remove()
    chosen = np.zeros(batch.num_graphs, dtype=bool)
    chosen[np.asarray(select, dtype=np.int64)] = True
    a = captured[0].double().numpy()[np.repeat(chosen, np.diff(batch.offsets))]
    return np.concatenate([[a.shape[0]], a.sum(0), (a * a).sum(0)])


def moments_problem(moments: np.ndarray, width: int) -> str | None:
    """Why a client's :func:`norm_input_moments` upload cannot be summed (None if it can)."""
    moments = np.asarray(moments)
    if moments.shape != (1 + 2 * width,):
        return f"moments have shape {moments.shape}, expected ({1 + 2 * width},)"
    if moments.dtype.kind != "f" or not np.isfinite(moments).all():
        return "moments are not finite floats"
    count, sums, squares = moments[0], moments[1:1 + width], moments[1 + width:]
    if count < 0 or not float(count).is_integer():
        return f"node count {count} is not a whole number >= 0"
    # Cauchy-Schwarz: sum a^2 >= (sum a)^2 / N for every channel (equality within rounding)
    if (squares < 0).any() or (count > 0 and (squares * count < sums * sums * (1 - 1e-9) - 1e-9).any()):
        return "sums of squares smaller than the squared sums allow"
    if count == 0 and (sums != 0).any():
        return "non-zero sums over zero nodes"
    return None


def pooled_norm_statistics(moments: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """BatchNorm running statistics of the union of the clients' nodes from their
    moments (:func:`norm_input_moments`) summed over the clients:

        N = sum_c N_c,   mean = (sum_c S_c) / N,   var = (sum_c Q_c - N mean^2) / (N - 1),

    the unbiased variance, which is what a train-mode PyTorch pass over all those
    nodes at once (momentum ``None``) stores as ``running_var``."""
    total = np.sum(np.asarray(moments, dtype=np.float64), axis=0)
    count, width = total[0], (total.size - 1) // 2
    if count < 2:
        raise ValueError(f"BatchNorm statistics need at least 2 nodes, the clients hold {count:.0f}")
    mean = total[1:1 + width] / count
    var = np.maximum(total[1 + width:] - count * mean * mean, 0.0) / (count - 1)
    return mean, var


def with_norm_statistics(weights: dict[str, np.ndarray], layer: str, mean: np.ndarray,
                         var: np.ndarray) -> dict[str, np.ndarray]:
    """``weights`` with BatchNorm layer ``layer``'s running mean and variance replaced."""
    return {**weights, f"{layer}.running_mean": np.asarray(mean, dtype=np.float32),
            f"{layer}.running_var": np.asarray(var, dtype=np.float32)}


def trainable_names(model) -> set[str]:
    """Names of the model's trainable parameters (its other shared state: BatchNorm statistics)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def local_train(model, batch: GraphBatch, labels: np.ndarray, select: np.ndarray, task: str,
                epochs: int, lr: float, seed: int, freeze_norm: bool = False) -> float:
    """``epochs`` full-batch Adam steps on the selected graphs; returns the last loss.
    ``freeze_norm``: BatchNorm statistics frozen (:func:`freeze_norm_statistics`)."""
    import torch

    torch.manual_seed(int(seed))
    select = np.asarray(select, dtype=np.int64)
    if select.size == 0 or epochs == 0:
        return 0.0
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64)[select])
    opt = torch.optim.Adam(model.parameters(), lr=float(lr))
    model.train()
    if freeze_norm:
        freeze_norm_statistics(model)
    loss = torch.zeros(())
    for _ in range(int(epochs)):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(_scores(model, batch, task, select), y)
        loss.backward()
        opt.step()
    return float(loss.detach())


def graph_slices(batch: GraphBatch) -> list[tuple]:
    """Per graph of the batch, its own ``(x, edge_index)`` (local node ids)."""
    import torch

    # one stable sort of the edges by graph instead of a mask over all edges per graph
    src_graph = batch.batch[batch.edge_index[0]]
    order = torch.argsort(src_graph, stable=True)
    ends = torch.bincount(src_graph, minlength=len(batch.offsets) - 1).cumsum(0).tolist()
    edges = batch.edge_index[:, order]
    out, start = [], 0
    for (a, b), end in zip(zip(batch.offsets[:-1], batch.offsets[1:]), ends):
        out.append((batch.x[int(a):int(b)], edges[:, start:end] - int(a)))
        start = end
    return out


def dp_sgd_train(model, batch: GraphBatch, labels: np.ndarray, select: np.ndarray, task: str, steps: int,
                 lr: float, clip: float, noise_multiplier: float, sample_rate: float, seed: int) -> int:
    """Local DP-SGD with one graph as the privacy unit (graph classification).

    Each step Poisson-samples the selected graphs (or k-hop subgraphs, task
    "centre": the loss is the centre node's, still a function of that
    subgraph alone) with probability
    ``sample_rate``, computes every sampled graph's own gradient (its loss
    depends on that graph only, so per-sample gradients are exact), clips each
    to L2 norm ``clip``, sums them, adds ``N(0, (noise_multiplier clip)^2)``
    to every coordinate and divides by the expected batch size
    ``sample_rate * len(select)`` (Opacus' convention); Adam then steps on
    this noised gradient (post-processing). That is the Sampled Gaussian
    Mechanism, accounted by Opacus' RDP accountant with ``(noise_multiplier,
    sample_rate)`` per step (add/remove adjacency of one graph).
    BatchNorm layers run in eval mode (frozen running statistics) so that no
    un-noised statistic of the data reaches the uploaded state. Returns the
    number of steps taken.
    """
    import torch

    select = np.asarray(select, dtype=np.int64)
    if select.size == 0 or steps == 0:
        return 0
    gen = torch.Generator().manual_seed(int(seed))
    rng = np.random.default_rng([int(seed), 41])
    pieces = graph_slices(batch)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=float(lr))
    model.train()
    freeze_norm_statistics(model)
    expected = float(sample_rate) * select.size
    for _ in range(int(steps)):
        total = [torch.zeros_like(p) for p in params]
        for g in select[rng.random(select.size) < sample_rate]:
            x, ei = pieces[g]
            z = model(x, ei)
            z = z[:1] if task == "centre" else z.mean(0, keepdim=True)
            loss = torch.nn.functional.cross_entropy(z, torch.tensor([int(labels[g])]))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            grads = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(params, grads)]
            norm = torch.sqrt(sum((gr * gr).sum() for gr in grads))
            factor = min(1.0, float(clip) / max(float(norm), 1e-12))
            for t, gr in zip(total, grads):
                t.add_(gr, alpha=factor)
        opt.zero_grad()
        for p, t in zip(params, total):
            noise = torch.normal(0.0, float(noise_multiplier) * float(clip), size=p.shape, generator=gen)
            p.grad = (t + noise) / expected
        opt.step()
    return int(steps)


def privatise_update(start: dict[str, np.ndarray], new: dict[str, np.ndarray], trainable: set[str],
                     mechanism, rng) -> dict[str, np.ndarray]:
    """Client-level DP-FedAvg on one client's round: the update ``new - start``
    of the trainable parameters, as one vector, goes through ``mechanism``
    (clip to L2 ``clip`` + Gaussian noise, :class:`app.privacy.gaussian.GaussianMechanism`);
    returns ``start + noised update``. Other state (BatchNorm statistics, frozen
    during DP training) must come back unchanged: it is returned as ``start``,
    and a change is an error rather than an unprotected upload."""
    keys = [k for k in new if k in trainable]
    for k in keys:
        if not np.isfinite(new[k]).all():
            raise ValueError(f"privatise_update: local training gave non-finite weights in {k!r}: the global "
                             "model has diverged (under client-level DP, noise too large for this model: lower "
                             "dp-noise or dp-clip)")
    for k in new:
        if k not in trainable and not np.array_equal(new[k], start[k]):
            raise ValueError(f"privatise_update: non-trainable state {k!r} changed during DP training")
    delta = np.concatenate([(new[k] - start[k]).ravel().astype(np.float64) for k in keys])
    noised = mechanism.apply(delta, rng=rng)
    out, pos = {k: np.asarray(start[k], dtype=np.float32).copy() for k in new}, 0
    for k in keys:
        size = start[k].size
        out[k] = (start[k] + noised[pos:pos + size].reshape(start[k].shape)).astype(np.float32)
        pos += size
    return out


def _check_layer(layer: str) -> None:
    if layer not in EMBEDDING_LAYERS:
        raise ValueError(f"unknown embedding layer {layer!r}; valid choices: " + ", ".join(EMBEDDING_LAYERS))


def embedding_width(model, num_classes: int, layer: str) -> int:
    """Columns of :func:`node_embeddings`: ``C`` for ``"classes"``, the hidden width for ``"hidden"``."""
    _check_layer(layer)
    return int(num_classes) if layer == "classes" else int(model.hidden)


def node_embeddings(model, batch: GraphBatch, layer: str) -> list[np.ndarray]:
    """Per graph, the softmax node embedding (rows in [0,1], sum 1): of the class
    scores (``n_i x C``) or of the last message-passing layer (``n_i x h``)."""
    import torch

    _check_layer(layer)
    model.eval()
    with torch.no_grad():
        scores = model(batch.x, batch.edge_index) if layer == "classes" else model.embed(batch.x, batch.edge_index)
        h = torch.softmax(scores, dim=1).numpy().astype(np.float64)
    return [h[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]


def predict_graphs(model, batch: GraphBatch, task: str) -> np.ndarray:
    """The GNN's own class predictions (for reference next to the SVC)."""
    import torch

    model.eval()
    with torch.no_grad():
        return _scores(model, batch, task, np.arange(batch.num_graphs)).argmax(1).numpy()


# --------------------------------------------------------------------------- LDP (Algorithm 1)


def graph_epsilon(num_nodes: int, epsilon: float) -> float:
    """LDP budget of one graph's embedding: ``epsilon``, or ``1/|V|`` when 0 (paper default)."""
    if epsilon < 0 or math.isnan(epsilon):
        raise ValueError(f"epsilon must be >= 0 or inf, got {epsilon}")
    return 1.0 / max(1, int(num_nodes)) if epsilon == 0 else float(epsilon)


def encode_graph(h: np.ndarray, epsilon_g: float, rng) -> tuple[np.ndarray, dict]:
    """Algorithm 1 on one graph's ``n x d`` embedding with graph budget ``epsilon_g``.

    Per row: budget ``epsilon_g / n`` spread over ``m = default_m(epsilon_g, d)``
    sampled coordinates (each an ``epsilon_g/(m n)`` randomised response), so
    the whole matrix is ``epsilon_g``-LDP. ``epsilon_g = inf``: no noise, the
    embedding itself (float64). Returns ``(codes, stats)``.
    """
    h = np.asarray(h, dtype=np.float64)
    n, d = h.shape
    if math.isinf(epsilon_g):
        return multibit_encode(h, math.inf, 0.0, 1.0)
    m = default_m(epsilon_g, d)
    return multibit_encode(h, epsilon_g / n, 0.0, 1.0, m=m, rng=rng)


# --------------------------------------------------------------------------- GW


def intra_distance(h: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of one graph's (encoded) embedding."""
    h = np.asarray(h, dtype=np.float64)
    sq = (h * h).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * h @ h.T, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.sqrt(d2)


def shortest_path_matrix(adj) -> np.ndarray:
    """All-pairs shortest path lengths (hops); unreachable pairs get max + 1."""
    from scipy.sparse.csgraph import shortest_path

    c = shortest_path(sp.csr_matrix(adj), unweighted=True, directed=False)
    finite = np.isfinite(c)
    c[~finite] = (c[finite].max() if finite.any() else 0.0) + 1.0
    return c


def merge_duplicates(h: np.ndarray, decimals: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``h`` and their weights (multiplicity / n).

    Nodes with identical embeddings are at distance 0 from each other and
    equidistant from every other node, so the uniform metric-measure space of
    ``h`` and the space of its distinct rows weighted by multiplicity are
    weakly isomorphic: their GW discrepancy to any third space is the same
    (GW is 0 between them). LDP codes with ``m`` non-zeros in ``{-1,0,1}^d``
    have at most ``C(d,m) 2^m`` distinct rows, so this shrinks the GW problem
    from ``n`` to a handful of points.

    Float embeddings are compared after rounding to ``decimals`` (rows of
    nodes with the same GNN colour can differ in the last float32 bits from
    the summation order); the rounding moves a point by < 1e-9 per coordinate.
    """
    h = np.round(np.asarray(h, dtype=np.float64), decimals)
    rows, counts = np.unique(h, axis=0, return_counts=True)
    return rows, counts / counts.sum()


def embedding_space(h: np.ndarray, merge: bool = True, features: bool = False) -> tuple:
    """(intra-distance matrix, node weights) of one graph's embedding: uniform
    weights over nodes, or over distinct rows weighted by multiplicity.
    ``features=True`` appends the (distinct) rows themselves as node features
    for fused GW (:func:`gw_pair` with ``alpha < 1``); merging stays exact
    there because merged nodes also have equal features."""
    if merge:
        rows, w = merge_duplicates(h)
    else:
        rows = np.asarray(h, dtype=np.float64)
        w = np.full(len(rows), 1.0 / len(rows))
    return (intra_distance(rows), w, rows) if features else (intra_distance(rows), w)


def gw_pair(c1: np.ndarray, c2: np.ndarray, p=None, q=None, max_iter: int = 10_000,
            x1=None, x2=None, alpha: float = 1.0) -> float:
    """GW discrepancy (square loss; uniform node weights unless ``p``/``q``
    given) by POT's conditional gradient, ``ot.gromov.gromov_wasserstein2``.

    ``alpha < 1``: fused GW (Titouan et al.; the paper's base metric for graphs
    with node features), ``ot.gromov.fused_gromov_wasserstein2`` with feature
    cost ``M_ij = ||x1_i - x2_j||^2`` weighted ``1 - alpha`` and the structure
    term weighted ``alpha``. Plain GW only sees each graph's intra-distances and
    is blind to where the nodes sit (any isometry of the embedding space, e.g.
    swapping the two softmax classes, costs nothing); the feature term is not.
    """
    import ot

    p = np.full(c1.shape[0], 1.0 / c1.shape[0]) if p is None else np.asarray(p, dtype=np.float64)
    q = np.full(c2.shape[0], 1.0 / c2.shape[0]) if q is None else np.asarray(q, dtype=np.float64)
    if alpha >= 1.0:
        return float(ot.gromov.gromov_wasserstein2(c1, c2, p, q, "square_loss", symmetric=True,
                                                   max_iter=max_iter))
    if x1 is None or x2 is None:
        raise ValueError(f"fused GW (alpha={alpha} < 1) needs node features of both graphs")
    m = ot.dist(np.asarray(x1, dtype=np.float64), np.asarray(x2, dtype=np.float64))
    return float(ot.gromov.fused_gromov_wasserstein2(m, c1, c2, p, q, "square_loss", symmetric=True,
                                                     alpha=float(alpha), max_iter=max_iter))


_POOL_SPACES: list = []


def _gw_chunk(args) -> list[tuple[int, int, float]]:
    pairs, max_iter, alpha = args
    sp_ = _POOL_SPACES
    return [(i, j, gw_pair(sp_[i][0], sp_[j][0], sp_[i][1], sp_[j][1], max_iter, sp_[i][2], sp_[j][2], alpha))
            for i, j in pairs]


def _pool_init(spaces) -> None:
    """Worker start: receive the spaces; leave Ctrl-C to the parent (which
    terminates the pool) and die with the parent even if it is SIGKILLed."""
    import ctypes
    import signal

    global _POOL_SPACES
    _POOL_SPACES = spaces
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() must just end us
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux/glibc: the pool's terminate() on exit still applies
        pass


class _TermAsInterrupt:
    """While active (main thread only), SIGTERM raises KeyboardInterrupt so the
    ``with Pool`` block exits through ``terminate()`` instead of orphaning
    its workers."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc):
        import signal

        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def gw_matrix(spaces: Sequence, workers: int = 2, max_iter: int = 10_000,
              stats: dict | None = None, alpha: float = 1.0) -> np.ndarray:
    """Symmetric matrix of GW discrepancies between all pairs (zero diagonal).

    ``spaces``: per item a distance matrix (uniform weights), a pair
    ``(distance matrix, weights)`` or a triple ``(distance, weights, node
    features)`` (needed for fused GW, ``alpha < 1``, see :func:`gw_pair`).
    Items with identical spaces get 0 (the exact value) and each distinct pair
    of spaces is solved once with :func:`gw_pair` (POT), in ``workers``
    processes (0 = all cores); pairs are dealt to the workers in
    cost-balanced chunks. The pool is terminated on any exception,
    Ctrl-C or SIGTERM, and its workers die with the parent. ``stats``
    (optional dict) receives ``pairs``, ``distinct_spaces`` and
    ``solved_pairs``.
    """
    global _POOL_SPACES
    items = []
    for s in spaces:
        s = s if isinstance(s, tuple) else (s, None)
        c, w = s[0], s[1]
        x = s[2] if len(s) > 2 else None
        c = np.ascontiguousarray(c, dtype=np.float64)
        w = np.full(c.shape[0], 1.0 / c.shape[0]) if w is None else np.ascontiguousarray(w, dtype=np.float64)
        if alpha < 1.0:
            if x is None:
                raise ValueError(f"fused GW (alpha={alpha} < 1) needs (distance, weights, features) per item")
            x = np.ascontiguousarray(x, dtype=np.float64)
        else:
            x = None
        items.append((c, w, x))
    n = len(items)
    index: dict[bytes, int] = {}
    uniq, which = [], np.empty(n, dtype=np.int64)
    for t, (c, w, x) in enumerate(items):
        key = c.shape[0].to_bytes(4, "little") + c.tobytes() + w.tobytes() + (b"" if x is None else x.tobytes())
        if key not in index:
            index[key] = len(uniq)
            uniq.append((c, w, x))
        which[t] = index[key]
    u = len(uniq)
    small = np.zeros((u, u))
    iu, ju = np.triu_indices(u, k=1)
    if stats is not None:
        stats.update({"pairs": n * (n - 1) // 2, "distinct_spaces": u, "solved_pairs": int(iu.size)})
    if iu.size:
        sizes = np.array([c.shape[0] for c, _, _ in uniq], dtype=np.float64)
        order = np.argsort(-(sizes[iu] * sizes[ju]), kind="stable")
        pairs = list(zip(iu[order].tolist(), ju[order].tolist()))
        workers = int(workers) or (os.cpu_count() or 1)
        if workers <= 1 or len(pairs) < 256:
            _POOL_SPACES = uniq
            results = _gw_chunk((pairs, max_iter, alpha))
        else:
            import multiprocessing as mp

            chunks = workers * 16
            parts = [(pairs[c::chunks], max_iter, alpha) for c in range(chunks)]
            with _TermAsInterrupt(), mp.get_context("fork").Pool(workers, _pool_init, (uniq,)) as pool:
                results = [r for part in pool.imap_unordered(_gw_chunk, parts) for r in part]
        for i, j, v in results:
            small[i, j] = small[j, i] = v
    return small[np.ix_(which, which)]


# --------------------------------------------------------------------------- downstream


def normalise(dist: np.ndarray) -> np.ndarray:
    """``D / median`` of the off-diagonal entries (the gamma grid is then
    relative to a typical distance; a pure rescaling, same for all sources)."""
    off = dist[~np.eye(len(dist), dtype=bool)]
    med = float(np.median(off)) if off.size else 0.0
    return dist / med if med > 0 else dist.copy()


SELECTIONS = ("validation", "cv")
CV_FOLDS = 5


#: how far a float embedding row's sum may be from 1 (torch's float32 softmax, cast to float64)
SOFTMAX_ATOL = 1e-4


def describe_problem(values: dict) -> str | None:
    """What is wrong with one client's ``gw_describe`` reply (``None``: nothing):
    ``in_dim`` and ``graphs`` are whole numbers >= 1 (a client without graphs
    refuses), ``train`` a whole number from 0 to ``graphs``."""
    counts = {name: whole_number(values[name]) for name in ("in_dim", "graphs", "train")}
    for name in ("in_dim", "graphs"):
        if counts[name] is None or counts[name] < 1:
            return f"{name}={values[name]!r}; valid: a whole number >= 1"
    if counts["train"] is None or not 0 <= counts["train"] <= counts["graphs"]:
        return f"train={values['train']!r}; valid: a whole number from 0 to its {counts['graphs']} graphs"
    return None


def embedding_upload_problem(arrays: dict, graphs: int, num_classes: int, epsilon: float) -> str | None:
    """What is wrong with one client's ``gw_embed`` upload (``None``: nothing).

    ``graphs``: how many graphs the client described; ``epsilon``: the run's
    ``gw-ldp.epsilon``. Below inf the embeddings must be Algorithm 1's codes:
    in {-1, 0, 1} with exactly ``m = default_m(graph_epsilon(n, epsilon), d)``
    non-zeros per row of a size-n graph (:func:`encode_graph`), so an unencoded
    or all-zero upload is not recorded as noised; at inf softmax rows (entries
    >= 0 summing to 1). Labels are -1 (unknown; always for test graphs) or a
    class below ``num_classes``, and the train/validation labels are the
    evaluation labels."""
    sizes = arrays["sizes"].astype(np.int64)
    if sizes.shape != (graphs,):
        return f"{sizes.size} graph sizes for the {graphs} graphs it described"
    for name in ("graph_ids", "split", "labels", "eval_labels"):
        if arrays[name].shape != (graphs,):
            return f"'{name}' has shape {arrays[name].shape}, expected ({graphs},)"
    emb = arrays["embeddings"]
    # Bounding every size first keeps the sum from wrapping around int64 onto the row count.
    if (sizes < 1).any() or (sizes > len(emb)).any() or sizes.sum() != len(emb):
        return (f"graph sizes from {sizes.min()} to {sizes.max()} (each from 1 to {len(emb)} expected) "
                f"sum to {sizes.sum()} for {len(emb)} embedding rows")
    rows = np.repeat(np.arange(graphs), sizes)  # the graph of every embedding row
    if math.isinf(epsilon):
        sums = emb.sum(1)
        bad = ~(np.isfinite(emb).all(1) & (emb >= 0).all(1) & (np.abs(sums - 1) <= SOFTMAX_ATOL))
        if bad.any():
            row = int(np.argmax(bad))
            return (f"graph {arrays['graph_ids'][rows[row]]}: embedding row {row} is not a softmax row "
                    f"(min {emb[row].min():.4g}, sum {sums[row]:.6g}; expected entries >= 0 summing to 1)")
    else:
        if not np.isin(emb, (-1, 0, 1)).all():
            return "LDP codes outside {-1, 0, 1}"
        m = np.array([default_m(graph_epsilon(int(n), epsilon), emb.shape[1]) for n in sizes])
        bad = np.count_nonzero(emb, axis=1) != m[rows]
        if bad.any():
            row = int(np.argmax(bad))
            return (f"graph {arrays['graph_ids'][rows[row]]}: LDP code row {row} has "
                    f"{np.count_nonzero(emb[row])} non-zeros, Algorithm 1 gives exactly m={m[rows[row]]}")
    ids, split = arrays["graph_ids"].astype(np.int64), arrays["split"].astype(np.int64)
    if (ids < 0).any() or np.unique(ids).size != ids.size:
        return "graph ids negative or repeated"
    if not np.isin(split, (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST)).all():
        return f"split codes outside {SPLIT_TRAIN}, {SPLIT_VAL}, {SPLIT_TEST}"
    labels, truth = arrays["labels"].astype(np.int64), arrays["eval_labels"].astype(np.int64)
    for name, lab in (("labels", labels), ("eval_labels", truth)):
        if ((lab < -1) | (lab >= num_classes)).any():
            return f"'{name}' outside -1..{num_classes - 1}"
    test = split == SPLIT_TEST
    if (labels[test] != -1).any() or (labels[~test] != truth[~test]).any():
        return "labels of test graphs must be -1 and the others equal to eval_labels"
    return None


def svc_problem(y: np.ndarray, split: np.ndarray, selection: str) -> str | None:
    """Why :func:`svc_select` cannot run on these labels and splits (``None``: it can).
    Labels -1 (unknown) do not count."""
    if selection not in SELECTIONS:
        return f"selection={selection!r}; valid choices: {', '.join(SELECTIONS)}"
    known = y >= 0
    if np.unique(y[known & (split == SPLIT_TRAIN)]).size < 2:
        return "the training split has fewer than 2 classes"
    if selection == "validation" and not (known & (split == SPLIT_VAL)).any():
        return "no labelled validation graphs to pick C and gamma on; use selection='cv'"
    if selection == "cv":
        counts = np.unique(y[known & (split != SPLIT_TEST)], return_counts=True)[1]
        if counts.min() < CV_FOLDS:
            return (f"too few train/validation graphs per class ({counts.min()}) for {CV_FOLDS}-fold "
                    "cross-validation; use selection='validation'")
    return None


def svc_select(dist: np.ndarray, y: np.ndarray, split: np.ndarray, selection: str = "validation",
               c_grid=C_GRID, gamma_grid=GAMMA_GRID) -> dict:
    """SVC with precomputed kernel ``exp(-gamma D)``, (C, gamma) picked without the test graphs.

    ``selection="validation"`` (the paper's 7:2:1 protocol): fit on the train
    split for every (C, gamma), keep the best validation accuracy (ties: first
    in grid order). ``"cv"``: keep the best mean accuracy of a stratified
    5-fold cross-validation over the train and validation graphs together
    (less noisy than one small validation split), then refit on all of them.
    Reports the chosen model's test accuracy and predictions for every item.

    ``test_acc_grid_max`` is the best test accuracy over the whole grid (models
    fitted on the train split): what a protocol that picks (C, gamma) on the
    test graphs would report. It is an optimistic bound, never an estimate,
    kept to show how much of a published figure such a choice could explain.

    Items with label -1 (unknown) take part in no fit, selection or score; the
    model still predicts them."""
    from sklearn.model_selection import StratifiedKFold
    from sklearn.svm import SVC

    problem = svc_problem(y, split, selection)
    if problem:
        raise ValueError(f"svc_select: {problem}")
    tr, va, te = (np.flatnonzero((split == s) & (y >= 0)) for s in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
    d = normalise(dist)
    pool = np.concatenate([tr, va])
    folds = []
    if selection == "cv":
        folds = list(StratifiedKFold(CV_FOLDS, shuffle=True, random_state=0).split(pool, y[pool]))
    best, tests = None, []
    for gamma in gamma_grid:
        k = np.exp(-gamma * d)
        for c in c_grid:
            model = SVC(C=c, kernel="precomputed").fit(k[np.ix_(tr, tr)], y[tr])
            if te.size:
                tests.append(float((model.predict(k[np.ix_(te, tr)]) == y[te]).mean()))
            if selection == "validation":
                score = float((model.predict(k[np.ix_(va, tr)]) == y[va]).mean()) if va.size else 0.0
            else:
                score = float(np.mean([
                    (SVC(C=c, kernel="precomputed").fit(k[np.ix_(pool[a], pool[a])], y[pool[a]])
                     .predict(k[np.ix_(pool[b], pool[a])]) == y[pool[b]]).mean() for a, b in folds]))
            if best is None or score > best[0]:
                best = (score, c, gamma, model)
    score, c, gamma, model = best
    k = np.exp(-gamma * d)
    fit_on = tr
    if selection == "cv":  # the chosen (C, gamma) refitted on every train and validation graph
        fit_on = pool
        model = SVC(C=c, kernel="precomputed").fit(k[np.ix_(pool, pool)], y[pool])
    pred = model.predict(k[:, fit_on])
    test = float((pred[te] == y[te]).mean()) if te.size else float("nan")
    return {"C": c, "gamma": gamma, "selection": selection, "val_acc": score, "test_acc": test,
            "test_acc_grid_max": max(tests, default=float("nan")), "predictions": pred.astype(np.int64)}


def kmedoids(dist: np.ndarray, k: int, seed: int, n_init: int = 10, max_iter: int = 100) -> np.ndarray:
    """Alternating k-medoids (Voronoi iteration) on a distance matrix, k-means++
    style seeding, best of ``n_init`` by total distance to the medoids."""
    n = len(dist)
    rng = np.random.default_rng(seed)
    best_cost, best = np.inf, None
    for _ in range(n_init):
        med = [int(rng.integers(n))]
        for _ in range(1, k):
            dmin = dist[:, med].min(1) ** 2
            med.append(int(rng.choice(n, p=dmin / dmin.sum())) if dmin.sum() > 0 else int(rng.integers(n)))
        med = np.array(med)
        for _ in range(max_iter):
            labels = dist[:, med].argmin(1)
            new = med.copy()
            for j in range(k):
                members = np.flatnonzero(labels == j)
                if members.size:
                    new[j] = members[dist[np.ix_(members, members)].sum(1).argmin()]
            if np.array_equal(new, med):
                break
            med = new
        labels = dist[:, med].argmin(1)
        cost = dist[np.arange(n), med[labels]].sum()
        if cost < best_cost:
            best_cost, best = cost, labels
    return best.astype(np.int64)


def cluster_gw(dist: np.ndarray, k: int, method: str, seed: int) -> np.ndarray:
    """Cluster items from their GW matrix: spectral clustering of the
    affinity ``exp(-D / median(D))`` (zero diagonal) or k-medoids on ``D``."""
    if method not in CLUSTERINGS:
        raise ValueError(f"unknown clustering {method!r}; valid choices: " + ", ".join(CLUSTERINGS))
    if method == "kmedoids":
        return kmedoids(dist, k, seed)
    from app.clustering import spectral_affinity

    aff = np.exp(-normalise(dist))
    np.fill_diagonal(aff, 0.0)
    return spectral_affinity(aff, k, seed)
