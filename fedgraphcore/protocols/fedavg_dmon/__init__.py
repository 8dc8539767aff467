"""Federated community detection: FedAvg of DMoN GNN weights (Leeney & McConville 2023).

Every client ``c`` holds a subgraph ``G_c = (X_c, A_c)`` of one global graph
(node partition; edges between clients are lost, the paper's setting; with
boundary edges the clients train on the whole graph instead:
:mod:`fedgraphcore.protocols.fedavg_dmon.boundary`) and trains the same model,
:class:`fedgraphcore.models.DMoNModel` (one GCN layer with SELU to ``hidden`` dims,
dropout, linear head to ``k``, softmax), on the DMoN loss
(:func:`fedgraphcore.models.dmon_loss`)::

    L(S) = -(1/2m) Tr(S'AS - S'd d'S / 2m) + lambda (sqrt(k)/n ||sum_i S_i|| - 1)

with Adam. One round = ``E`` local epochs from the current global weights,
then the server averages (McMahan et al. eq. 3 of the paper)::

    W_bar = sum_c (N_c / N) W_c,      N = sum_c N_c,

``N_c`` = number of nodes client ``c`` holds (its shard's rows, copies made by
overlap included). With one client this is exactly centralised full-batch
training (:func:`fedgraphcore.models.train_dmon`) step for step, provided the
client keeps its Adam moments and its dropout random stream between rounds
(``optimizer_state="keep"``, the default; see :class:`LocalState`).

Edge split (the paper's 0.7/0.1/0.2 train/validation/test split of the
adjacency, undirected edges kept whole): every undirected edge ``{u, v}`` of
the *global* graph is assigned by a keyed hash of its global node ids
(:func:`edge_split_codes`), so each client's split is the restriction of one
global split, identical across modes and client counts. The GCN propagates
over and the loss is computed on the training edges only; validation edges
score model selection, test edges the final modularity/conductance.

Model selection (unsupervised, labels never used): the weights with the
highest modularity of their hard assignment on the validation edges
(:func:`validation_score`), aggregated over clients as the mean weighted by
validation-edge counts. The paper selects on validation macro-F1, i.e. with
ground-truth labels; that is label leakage in an unsupervised task and is not
offered. Not available under DP (below): the last weights are used.

Client-level DP-FedAvg (optional): the client clips its update
``W_c - W_bar`` to L2 norm ``C`` and adds ``N(0, (z C)^2)`` to every entry
(:class:`fedgraphcore.privacy.gaussian.GaussianMechanism`, replace adjacency: the
protected unit is a client's entire local data, sensitivity ``2C``), then
uploads ``W_bar + noised update`` (:func:`dp_mechanism`, which client and
server both build, the server to account). One release per client per round, and
nothing else data-dependent in the training rounds: the validation scores
and losses, which the noise does not cover, are not sent.

Wire protocol (what leaves each client in **bold**):

1. With ``hello``: **sizes only**: feature dimension (``num_features``)
   beside the number of nodes held (``num_rows``, the FedAvg weight ``N_c``).
2. ``train.dmon_train`` x num-rounds. Down: the global weights ``W_r`` (4
   float32 arrays, ``DMoNModel.state_dict()`` names; isolated/centralised:
   round 1 only, the common initialisation) and ``k``. The client trains
   ``local-epochs`` Adam epochs and replies, except with ``dp-clip > 0``
   (see below), **the validation modularity of W_r (in [-1/2, 1]) and its
   validation-edge count (a whole number), the per-epoch losses (one finite
   number per local epoch)**, and in federated mode **its trained
   weights W_c** (exact shapes, finite; a bad upload is rejected and that
   client left out of the average and, as ``ServerSession`` does for every
   rejected reply, dropped for the rest of the run; one whose SuperNode left
   and came back with the same shard is taken back at the next round,
   ``ServerSession.take_back``). With ``dp-clip > 0`` the weights are
   ``W_r + clip(W_c - W_r) + N(0, (z C)^2)`` (client-level DP-FedAvg); with
   ``secure`` the upload is instead one ring vector, the pairwise-masked
   fixed-point ``(N_c/N) * W_c`` (the server learns only the weighted sum,
   i.e. the new global model; every client must answer).
3. ``query.dmon_eval`` (federated, ``select=val-modularity``, so never with
   DP; down: the final global weights) -> up: **validation modularity and
   validation-edge count**.
4. ``query.dmon_assign`` (down: the selected global weights; isolated:
   nothing) -> up: **node ids, cluster labels, owned flags and the client's
   own metrics** (ACC/NMI/ARI/macro-F1 on its nodes, modularity/conductance
   on its test edges and on its whole local graph; without DP also the
   validation modularity of those weights): evaluation outputs, like every
   strategy's, outside the DP guarantee.

Client-level DP (``dp-clip > 0``, federated only): in the training rounds a
client sends nothing but its noised weights, so the epsilon reported
(``metrics["dp_epsilon"]``, Opacus RDP accountant, one release per round)
covers its whole local subgraph there. The validation scores and losses are
functions of that subgraph the noise does not cover, so they are not sent
(and ``dmon_eval`` is refused); the server cannot select a round by
validation modularity and requires ``select=last`` (anything else is a
ConfigError before any message is sent). The round history then records
``val_modularity``, ``loss`` and ``losses`` as None. Not covered, sent in
clear: the feature dimension and node count (step 1, needed for the FedAvg
weights) and the evaluation outputs of step 4.

Server: ``W_{r+1} = sum_c (N_c/N) W_c`` over the valid uploads; model
selection (``select=val-modularity``) keeps the global weights with the
best validation-edge-weighted mean validation modularity (federated), or
each client keeps its own best (isolated/centralised).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, Mapping

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigView, setting
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

# -- wire: the protocol's steps and what a valid reply holds -------------------------------
DMON_EVAL = "dmon_eval"
DMON_ASSIGN = "dmon_assign"
DMON_TRAIN = "dmon_train"

#: names and order of the model's arrays on the wire (``DMoNModel.state_dict()`` keys)
PARAM_NAMES = ("conv.bias", "conv.lin.weight", "head.weight", "head.bias")

MODES = ("federated", "isolated", "centralised")
#: whole-graph mode: what the server aggregates (:mod:`fedgraphcore.protocols.fedavg_dmon.gradient`)
AGGREGATE = ("gradient", "weights")
SELECT = ("val-modularity", "last")
OPT_STATE = ("keep", "reset")

TRAIN, VAL, TEST = 0, 1, 2
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class FedAvgDMoNConfig(ConfigView):
    """The ``fedavg-dmon.*`` keys of :class:`strategies.fedavg_dmon.FedAvgDMoN` and its client, declared here."""

    prefix: ClassVar[str] = "fedavg-dmon"
    mode: str = setting("federated", "federated (FedAvg), isolated (no aggregation) or centralised (one client with "
                        "the whole graph)", choices=MODES, primary=True)
    local_epochs: int = setting(5, "local Adam epochs per round", low=1, high=100_000, primary=True)
    lr: float = setting(1e-3, "Adam learning rate", low=1e-12, high=10.0, primary=True)
    hidden: int = setting(64, "GCN output dimension", low=1, high=100_000)
    dropout: float = setting(0.5, "dropout after the GCN layer", low=0.0, high=0.99)
    collapse: float = setting(1.0, "collapse regularisation lambda of the DMoN loss", low=0.0)
    sparse_features: bool = setting(True, "feed the features to the GCN as a sparse tensor (same model; fast on "
                                    "bag-of-words)")
    optimizer_state: str = setting("keep", "keep: each client's Adam moments persist between rounds; reset: fresh "
                                   "Adam every round", choices=OPT_STATE)
    val_fraction: float = setting(0.1, "fraction of edges held out for model selection", low=0.0, high=0.9)
    test_fraction: float = setting(0.2, "fraction of edges held out for testing", low=0.0, high=0.9)
    select: str = setting("val-modularity", "model selection: best validation-edge modularity, or the last weights "
                          "(dp-clip > 0 needs last: clients then send no validation score)", choices=SELECT)
    dp_clip: float = setting(0.0, "client-level DP-FedAvg: L2 clip of each update (0 = off; needs select=last)",
                             low=0.0)
    dp_noise: float = setting(1.0, "DP-FedAvg noise multiplier z (sigma = z * clip)", low=1e-6)
    dp_epsilon: float = setting(0.0, "DP-FedAvg: if > 0, calibrate z to reach this epsilon after num-rounds rounds "
                                "(at most 1e4: Opacus' search for z does not end for a huge epsilon, which protects "
                                "nothing anyway)", low=0.0, high=1e4)
    dp_delta: float = setting(1e-5, "DP-FedAvg delta", low=1e-12, high=0.5)
    secure: bool = setting(False, "secure aggregation of the weighted weights")
    aggregate: str = setting("gradient", "whole-graph mode (federated, partition.boundary=true) only: gradient (the "
                             "server keeps the model and Adam and steps on the parties' summed exact gradients, "
                             "num-rounds x local-epochs steps: centralised full-batch training) or weights (local "
                             "Adam epochs, FedAvg of the weights)", choices=AGGREGATE, primary=True)


#: What a client adds to its hello reply: its feature dimension (its node count, the FedAvg weight, is
#: hello's ``num_rows``)
HELLO_NUMBERS = {"num_features": ValueSpec(whole=True, low=1)}
#: A client's validation score: the modularity of its labels on its validation edges (in [-1/2, 1]) and
#: the number of those edges (its weight in the combined score).
SCORE_SPEC = {"val_modularity": ValueSpec(low=-0.5, high=1.0), "val_edges": ValueSpec(whole=True, low=0)}
#: ``dmon_eval``: the validation score of the weights sent
EVAL_REPLY = ReplySpec(numbers=SCORE_SPEC)


def train_reply(shapes: Mapping[str, tuple[int, ...]], epochs: int, federated: bool, secure: bool,
                dp: bool) -> ReplySpec:
    """``dmon_train``: without DP the validation score and the ``epochs`` losses; in federated mode
    the trained weights (``secure``: one masked ring vector of all of them), noised under ``dp``."""
    scored = {} if dp else {**SCORE_SPEC, "losses": ValueSpec(length=epochs)}  # under DP: the noised weights only
    if secure:
        size = sum(int(np.prod(s)) for s in shapes.values())
        return ReplySpec(arrays={"weights": ArraySpec((size,), kind="u", masked=True, noised=dp)}, numbers=scored)
    if federated:
        return ReplySpec(arrays={n: ArraySpec(shapes[n], kind="f", noised=dp) for n in PARAM_NAMES}, numbers=scored)
    return ReplySpec(numbers=scored)


def assign_reply(k: int) -> ReplySpec:
    """``dmon_assign``: node ids, their labels in ``0..k-1`` and owned flags; the client's own metrics."""
    return ReplySpec(arrays={"node_ids": ArraySpec((None,), kind="iu", low=0, unique=True),
                             "labels": ArraySpec((None,), kind="iu", low=0, high=k),
                             "owned": ArraySpec((None,), kind="iu", low=0, high=2)},
                     same_length=("node_ids", "labels", "owned"),
                     optional={name: ValueSpec(low=-1.0, high=1.0) for name in CLIENT_METRICS})


# -- client-level DP: the mechanism client and server build alike -------------------------


@lru_cache(maxsize=32)
def _calibrated(epsilon: float, delta: float, rounds: int) -> float:
    from fedgraphcore.privacy.gaussian import calibrate_noise_multiplier

    return calibrate_noise_multiplier(epsilon, delta, rounds, adjacency="replace")


def dp_noise_multiplier(cfg: FedAvgDMoNConfig, rounds: int) -> float:
    """``dp-noise``, or the multiplier reaching ``dp-epsilon`` after ``rounds`` releases."""
    if cfg.dp_epsilon > 0:
        return _calibrated(cfg.dp_epsilon, cfg.dp_delta, rounds)
    return cfg.dp_noise


def dp_mechanism(cfg: FedAvgDMoNConfig, rounds: int):
    """The client-level Gaussian mechanism (one release per client per round, ``rounds`` rounds)."""
    from fedgraphcore.privacy.gaussian import GaussianMechanism

    return GaussianMechanism(cfg.dp_clip, dp_noise_multiplier(cfg, rounds), delta=cfg.dp_delta, adjacency="replace")


def param_shapes(num_features: int, k: int, hidden: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the model arrays (what a valid weight upload must look like)."""
    return {
        "conv.bias": (hidden,),
        "conv.lin.weight": (hidden, num_features),
        "head.weight": (k, hidden),
        "head.bias": (k,),
    }


def dropout_seed(seed: int, client: int) -> int:
    """Seed of client ``client``'s dropout stream; client 0 uses ``seed`` itself,
    so a single client reproduces :func:`fedgraphcore.models.train_dmon` exactly."""
    return int(seed) + 1_000_003 * int(client)


# --------------------------------------------------------------------------- edge split


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x & _MASK64


def edge_split_codes(u: np.ndarray, v: np.ndarray, seed: int, val: float, test: float) -> np.ndarray:
    """TRAIN/VAL/TEST code of each edge ``{u_i, v_i}`` (global node ids).

    ``h = splitmix64(splitmix64(min * 2^32 + max) ^ splitmix64(seed))`` mapped
    to [0, 1); ``h < 1 - val - test`` is training, then validation, then test.
    Symmetric in ``(u, v)`` and independent of who holds the edge.
    """
    if val < 0 or test < 0 or val + test >= 1:
        raise ValueError(f"invalid edge split val={val}, test={test}; need val, test >= 0 and val + test < 1")
    a = np.minimum(u, v).astype(np.uint64)
    b = np.maximum(u, v).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _splitmix64((a << np.uint64(32)) | b) ^ _splitmix64(np.array([int(seed) & 0xFFFFFFFF], dtype=np.uint64))
    h = (_splitmix64(key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    codes = np.full(h.shape, TEST, dtype=np.int8)
    codes[h < 1.0 - test] = VAL
    codes[h < 1.0 - val - test] = TRAIN
    return codes


def split_adjacency(adj: sp.csr_matrix, node_ids: np.ndarray, seed: int, val: float, test: float
                    ) -> tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]:
    """``(train, val, test)`` adjacencies (local ids, symmetric, disjoint, summing to ``adj``)."""
    coo = sp.coo_matrix(adj)
    codes = edge_split_codes(node_ids[coo.row], node_ids[coo.col], seed, val, test)
    n = adj.shape[0]
    out = []
    for code in (TRAIN, VAL, TEST):
        keep = codes == code
        m = sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=(n, n), dtype=np.float64)
        m.sort_indices()
        out.append(m)
    return tuple(out)


# --------------------------------------------------------------------------- weights


def init_weights(num_features: int, k: int, seed: int, hidden: int = 64, dropout: float = 0.5) -> dict[str, np.ndarray]:
    """Initial global weights: ``torch.manual_seed(seed)`` then ``DMoNModel(...)``,
    exactly as :func:`fedgraphcore.models.train_dmon` initialises (Xavier uniform).
    The caller's global torch RNG state is left untouched."""
    import torch

    from fedgraphcore.models import DMoNModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = DMoNModel(num_features, k, hidden=hidden, dropout=dropout)
        return get_weights(model)


def get_weights(model) -> dict[str, np.ndarray]:
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def set_weights(model, weights: Mapping[str, np.ndarray]) -> None:
    import torch

    state = {name: torch.from_numpy(np.ascontiguousarray(weights[name], dtype=np.float32)) for name in PARAM_NAMES}
    model.load_state_dict(state, strict=True)


def flatten(weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """One float64 vector ``[w for name in PARAM_NAMES]`` (for clipping / secure sums)."""
    return np.concatenate([np.asarray(weights[n], dtype=np.float64).ravel() for n in PARAM_NAMES])


def unflatten(vector: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`flatten` (float32 arrays)."""
    out, at = {}, 0
    for name in PARAM_NAMES:
        size = int(np.prod(shapes[name]))
        out[name] = np.asarray(vector[at: at + size], dtype=np.float32).reshape(shapes[name])
        at += size
    if at != vector.size:
        raise ValueError(f"vector has {vector.size} entries, the shapes need {at}")
    return out


def fedavg(weights: list[Mapping[str, np.ndarray]], counts: list[float]) -> dict[str, np.ndarray]:
    """Server step: ``sum_c (N_c / N) W_c`` per array, accumulated in float64, returned float32."""
    if not weights:
        raise ValueError("fedavg of no clients")
    if len(weights) != len(counts):
        raise ValueError(f"{len(weights)} weight sets but {len(counts)} counts")
    counts = np.asarray(counts, dtype=np.float64)
    if (counts <= 0).any():
        raise ValueError(f"node counts must be > 0, got {counts.tolist()}")
    total = counts.sum()
    out = {}
    for name in PARAM_NAMES:
        acc = np.zeros(np.shape(weights[0][name]), dtype=np.float64)
        for w, n in zip(weights, counts):
            acc += (n / total) * np.asarray(w[name], dtype=np.float64)
        out[name] = acc.astype(np.float32)
    return out


# --------------------------------------------------------------------------- local training


@dataclass
class Graph:
    """One client's tensors: features, training edges (GCN input and loss)."""

    x: "object"           # torch float32 n x f
    edge_index: "object"  # torch long 2 x E (training edges, both directions)
    edge_weight: "object"  # torch float32 E


def make_graph(x, adj_train: sp.csr_matrix, sparse_features: bool = False) -> Graph:
    """Tensors as :func:`fedgraphcore.models.train_dmon` builds them (``sparse_features``:
    the features as a torch sparse COO tensor, same as its ``sparse_features=True``)."""
    from fedgraphcore.models import adj_to_edge_index, features_to_tensor

    xt = features_to_tensor(x, adj_train.shape[0])
    if sparse_features:
        xt = xt.to_sparse()
    ei, ew = adj_to_edge_index(adj_train)
    return Graph(xt, ei, ew)


_MODELS: dict = {}


def shared_model(f: int, k: int, hidden: int, dropout: float):
    """A reusable DMoNModel module of this shape (built once per process without
    touching the caller's RNG; its weights are always overwritten before use)."""
    import torch

    from fedgraphcore.models import DMoNModel

    key = (int(f), int(k), int(hidden), float(dropout))
    if key not in _MODELS:
        with torch.random.fork_rng(devices=[]):
            _MODELS[key] = DMoNModel(f, k, hidden=hidden, dropout=dropout)
    return _MODELS[key]


class LocalState:
    """A client's training state between rounds, as plain numpy arrays.

    ``weights`` (current local model), ``adam`` (Adam moments and step count
    per parameter, empty before the first step or with
    ``optimizer_state="reset"``) and ``rng`` (the torch CPU generator state
    driving dropout). Restoring all three makes round-by-round training
    identical to one uninterrupted training loop.
    """

    def __init__(self, weights: dict, adam: dict | None = None, rng: np.ndarray | None = None):
        self.weights = weights
        self.adam = adam or {}
        self.rng = rng

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {f"w/{k}": v for k, v in self.weights.items()}
        out.update({f"adam/{k}": v for k, v in self.adam.items()})
        if self.rng is not None:
            out["rng"] = self.rng
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "LocalState":
        weights = {k[2:]: v for k, v in arrays.items() if k.startswith("w/")}
        adam = {k[5:]: v for k, v in arrays.items() if k.startswith("adam/")}
        return cls(weights, adam, arrays.get("rng"))


def start_state(weights: Mapping[str, np.ndarray], seed: int, client: int, k: int, hidden: int,
                dropout: float) -> LocalState:
    """State before the first round: the given weights, no Adam moments, and the
    dropout stream as :func:`fedgraphcore.models.train_dmon` leaves it after building
    its model (``manual_seed`` then the initialisation draws)."""
    import torch

    from fedgraphcore.models import DMoNModel

    f = int(np.shape(weights["conv.lin.weight"])[1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(dropout_seed(seed, client))
        DMoNModel(f, k, hidden=hidden, dropout=dropout)  # same RNG draws as the centralised init
        rng = torch.get_rng_state().numpy().copy()
    return LocalState({n: np.asarray(weights[n], dtype=np.float32) for n in PARAM_NAMES}, {}, rng)


def _adam_state_dict(opt, adam: Mapping[str, np.ndarray]) -> dict:
    import torch

    groups = opt.state_dict()["param_groups"]
    state = {}
    for i, _ in enumerate(PARAM_NAMES):
        if f"{i}.step" in adam:
            state[i] = {
                "step": torch.tensor(float(adam[f"{i}.step"][0]), dtype=torch.float32),
                "exp_avg": torch.from_numpy(np.array(adam[f"{i}.exp_avg"], dtype=np.float32)),
                "exp_avg_sq": torch.from_numpy(np.array(adam[f"{i}.exp_avg_sq"], dtype=np.float32)),
            }
    return {"state": state, "param_groups": groups}


def _adam_arrays(opt) -> dict[str, np.ndarray]:
    out = {}
    for i, s in opt.state_dict()["state"].items():
        out[f"{i}.step"] = np.array([float(s["step"])], dtype=np.float64)
        out[f"{i}.exp_avg"] = s["exp_avg"].numpy().copy()
        out[f"{i}.exp_avg_sq"] = s["exp_avg_sq"].numpy().copy()
    return out


def local_train(state: LocalState, graph: Graph, k: int, epochs: int, lr: float = 1e-3, hidden: int = 64,
                dropout: float = 0.5, collapse: float = 1.0, weights: Mapping[str, np.ndarray] | None = None,
                keep_optimizer: bool = True) -> tuple[LocalState, list[float]]:
    """Client step: ``epochs`` full-batch Adam steps on the DMoN loss.

    Starts from ``weights`` (the global model) if given, else from
    ``state.weights`` (isolated training). Adam moments come from ``state``
    when ``keep_optimizer`` (else fresh); the dropout stream continues from
    ``state.rng``. The loop is :func:`fedgraphcore.models.train_dmon`'s (:func:`fedgraphcore.models.dmon_epochs`).
    Returns the new state and the per-epoch losses.
    """
    from fedgraphcore.models import dmon_epochs

    def body(model, opt):
        return dmon_epochs(model, opt, graph.x, graph.edge_index, graph.edge_weight, epochs, collapse)

    return train_from(state, weights, k, lr, hidden, dropout, keep_optimizer, body)


def train_from(state: LocalState, weights: Mapping[str, np.ndarray] | None, k: int, lr: float, hidden: int,
               dropout: float, keep_optimizer: bool, body) -> tuple[LocalState, list[float]]:
    """Run ``body(model, optimizer) -> losses`` on the shared model loaded with ``weights`` (else
    ``state.weights``), Adam's moments from ``state`` (``keep_optimizer``) and the dropout stream
    from ``state.rng``; returns the new state and the losses."""
    import torch

    start = weights if weights is not None else state.weights
    f = int(np.shape(start["conv.lin.weight"])[1])
    model = shared_model(f, k, hidden, dropout)
    set_weights(model, start)
    with torch.random.fork_rng(devices=[]):
        if state.rng is not None:
            torch.set_rng_state(torch.from_numpy(np.asarray(state.rng, dtype=np.uint8)))
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=0.0)
        if keep_optimizer and state.adam:
            opt.load_state_dict(_adam_state_dict(opt, state.adam))
        losses = body(model, opt)
        rng = torch.get_rng_state().numpy().copy()
    adam = _adam_arrays(opt) if keep_optimizer else {}
    return LocalState(get_weights(model), adam, rng), losses


def assign(weights: Mapping[str, np.ndarray], graph: Graph, k: int, hidden: int = 64) -> np.ndarray:
    """Hard labels ``argmax_j S_ij`` of the model in eval mode (no dropout, no RNG use)."""
    import torch

    f = int(np.shape(weights["conv.lin.weight"])[1])
    model = shared_model(f, k, hidden, 0.0)
    set_weights(model, weights)
    model.eval()
    with torch.no_grad():
        s = model(graph.x, graph.edge_index, graph.edge_weight)
    return s.argmax(dim=1).numpy().astype(np.int64)


def validation_score(labels: np.ndarray, adj_val: sp.csr_matrix) -> tuple[float, int]:
    """``(modularity of labels on adj_val, number of undirected validation edges)``;
    ``(0.0, 0)`` when the client has no validation edge."""
    from fedgraphcore.metrics import modularity

    edges = int(adj_val.nnz // 2)
    if adj_val.nnz == 0:
        return 0.0, 0
    return float(modularity(adj_val, labels)), edges


def combine_scores(scores: list[float], edges: list[int]) -> float:
    """Server: validation scores of clients averaged, weighted by validation edges
    (unweighted mean if nobody has any)."""
    e = np.asarray(edges, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if e.sum() > 0:
        return float((s * e).sum() / e.sum())
    return float(s.mean()) if s.size else -math.inf


#: What :func:`client_metrics` and the validation score may report (all in [-1, 1]).
CLIENT_METRICS = ("acc", "nmi", "ari", "f1", "modularity_test", "conductance_test", "modularity_local",
                  "conductance_local", "val_modularity")


def client_metrics(labels: np.ndarray, y: np.ndarray | None, adj_test: sp.csr_matrix, adj: sp.csr_matrix) -> dict:
    """A client's own evaluation: ACC/NMI/ARI/macro-F1 on its nodes (needs ``y``),
    modularity/conductance on its test edges (``*_test``) and on its whole local graph."""
    from fedgraphcore.metrics import evaluate

    out = {}
    if y is not None:
        out.update(evaluate(labels, y_true=y))
    for name, a in (("test", adj_test), ("local", adj)):
        m = evaluate(labels, adj=a)
        for key in ("modularity", "conductance"):
            if key in m:
                out[f"{key}_{name}"] = m[key]
    # rounding can put a perfect score a hair beyond its range (NMI 1.0000000000000002)
    return {key: float(np.clip(v, -1.0, 1.0)) for key, v in out.items()}


def dp_update(global_weights: Mapping[str, np.ndarray], local_weights: Mapping[str, np.ndarray],
              mechanism, rng=None) -> dict[str, np.ndarray]:
    """Client-level DP-FedAvg upload: ``W_bar + clip_C(W_c - W_bar) + N(0, (zC)^2)``."""
    delta = flatten(local_weights) - flatten(global_weights)
    noised = mechanism.apply(delta, rng)
    shapes = {n: tuple(np.shape(global_weights[n])) for n in PARAM_NAMES}
    return unflatten(flatten(global_weights) + noised, shapes)
