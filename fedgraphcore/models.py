"""The GNN models the methods train: DMoN (fedavg-dmon) and GCN / GIN (gw-ldp).

Importing this module imports torch and PyG, so the protocol modules import it
inside the functions that build a model, never at their top (a deployed
ClientApp process imports them for every message).

**DMoN** (Tsitsulin et al., "Graph clustering with graph neural networks"):
shared by the centralised reference (:func:`train_dmon`) and the
federated DMoN strategy (FedAvg over :class:`DMoNModel` weights, each client
minimising :func:`dmon_loss` on its own subgraph).

Model (as in the federated community-detection paper): one GCN layer
``H = SELU(A_hat X W_1 + b_1)`` with ``A_hat = D~^-1/2 (A + I) D~^-1/2`` (PyG
``GCNConv``), a linear head and a softmax over the k clusters:
``S = softmax(dropout(H W_2 + b_2))``. Dropout sits on the cluster logits, as
in the DMoN authors' code and PyG's ``DMoNPooling`` (measured on Cora, 1000
epochs, seed 0: ACC 62.3 / F1 61.3 / NMI 45.7 / Q 0.741 with dropout on the
logits vs 53.3 / 50.6 / 41.6 / 0.737 with dropout on H).

Loss (DMoN paper, eq. for the spectral modularity objective with the collapse
regulariser; ``A`` = adjacency without self-loops, ``d = A 1``, ``2m = 1' A 1``)::

    L(S) = -(1/2m) Tr(S' A S - S' d d' S / 2m)  +  lambda * (sqrt(k)/n * ||sum_i S_i||_2 - 1)

computed sparsely: ``Tr(S' A S) = sum_{(i,j) in E} A_ij <S_i, S_j>`` (both
directions stored) and ``Tr(S' d d' S) = ||S' d||^2``, so the cost is
O(|E| k + n k), never n x n.

**GCN / GIN** (:func:`build_model`, gw-ldp's shared GNN): GCN is 2 ``GCNConv``
layers (hidden 16), GIN 5 ``GINConv`` layers (hidden 64, each MLP and layer
with BatchNorm) then two linear layers. Both give per-node class scores; their
``embed`` is the last message-passing layer's output.
"""

from __future__ import annotations

import math
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgraphcore.clustering import as_features, check_k, check_seed, square_sparse

#: the names PyG gives the modules it generates for a layer class (torch_geometric.template)
GENERATED = ("_propagate", "_edge_updater")


@contextmanager
def generated_files_removed() -> Iterator[None]:
    """PyG writes the code it generates for each message-passing layer class (its ``propagate``)
    to a file of its own in the system's temporary folder when a process builds the first layer
    of that class, loads it, and leaves the file there: hundreds gather over many runs. The
    layers built inside this block leave none: the modules stay loaded, their files go."""
    before = set(sys.modules)
    try:
        yield
    finally:
        folder = Path(tempfile.gettempdir()).resolve()
        for name in set(sys.modules) - before:
            file = getattr(sys.modules.get(name), "__file__", None)
            if file and name.endswith(GENERATED) and Path(file).resolve().parent == folder:
                Path(file).unlink(missing_ok=True)

__all__ = ["DMoNModel", "dmon_loss", "dmon_epochs", "adj_to_edge_index", "features_to_tensor", "train_dmon", "GCN",
           "GIN", "build_model"]


def adj_to_edge_index(adj: Any, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """scipy (sparse) adjacency -> (``edge_index`` [2, E] long, ``edge_weight`` [E] of ``dtype``).

    Every stored entry becomes one directed edge (a symmetric matrix gives both
    directions); explicit zeros are dropped.
    """
    coo = sp.coo_matrix(adj)
    keep = coo.data != 0
    row, col, w = coo.row[keep], coo.col[keep], coo.data[keep]
    edge_index = torch.from_numpy(np.vstack([row, col]).astype(np.int64))
    return edge_index, torch.from_numpy(np.asarray(w, dtype=np.float64)).to(dtype)


def features_to_tensor(x: Any, num_nodes: int | None = None) -> Tensor:
    """Dense float32 feature tensor; ``None`` -> identity features (one-hot node ids)."""
    if x is None:
        if num_nodes is None:
            raise ValueError("features are None and num_nodes is unknown")
        return torch.eye(num_nodes, dtype=torch.float32)
    if sp.issparse(x):
        x = x.toarray()
    return torch.as_tensor(np.asarray(x, dtype=np.float32))


class DMoNModel(nn.Module):
    """One GCN layer with SELU to ``hidden`` dims, linear head to ``k``, dropout, softmax.

    ``forward(x, edge_index, edge_weight=None)`` returns the soft assignment
    matrix S (n x k, rows sum to 1). Weights are Xavier-uniform initialised.
    """

    def __init__(self, in_channels: int, k: int, hidden: int = 64, dropout: float = 0.5):
        super().__init__()
        if k < 1:
            raise ValueError(f"invalid number of clusters k={k}; need k >= 1")
        if in_channels < 1:
            raise ValueError(f"invalid in_channels={in_channels}; need >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"invalid dropout={dropout}; valid range [0, 1)")
        from torch_geometric.nn import GCNConv

        self.k = k
        self.dropout = dropout
        with generated_files_removed():
            self.conv = GCNConv(in_channels, hidden)
        self.head = nn.Linear(hidden, k)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.conv.reset_parameters()  # glorot (Xavier uniform) weight, zero bias
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        h = F.selu(self.conv(x, edge_index, edge_weight))
        logits = F.dropout(self.head(h), p=self.dropout, training=self.training)
        return torch.softmax(logits, dim=-1)


def dmon_loss(
    s: Tensor,
    edge_index: Tensor,
    edge_weight: Tensor | None = None,
    collapse_regularization: float = 1.0,
    return_terms: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """DMoN loss of soft assignments ``s`` (n x k) on the graph ``edge_index``.

    ``spectral = -(1/2m) (sum_{(i,j)} w_ij <s_i, s_j> - ||s' d||^2 / 2m)`` and
    ``collapse = sqrt(k)/n * ||sum_i s_i||_2 - 1``; returns
    ``spectral + collapse_regularization * collapse`` (and the two terms if
    ``return_terms``). ``edge_index`` must hold both directions of every
    undirected edge (as :func:`adj_to_edge_index` does); self-loops, if any,
    count once, as ``A_ii`` in the dense formula.
    """
    if s.dim() != 2:
        raise ValueError(f"assignments must be n x k, got shape {tuple(s.shape)}")
    n, k = s.shape
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.shape[1], dtype=s.dtype, device=s.device)
    edge_weight = edge_weight.to(s.dtype)
    src, dst = edge_index[0], edge_index[1]
    degrees = torch.zeros(n, dtype=s.dtype, device=s.device).index_add_(0, src, edge_weight)
    two_m = degrees.sum()
    if float(two_m) <= 0:
        spectral = s.new_zeros(())
    else:
        intra = (edge_weight * (s[src] * s[dst]).sum(dim=1)).sum()  # Tr(S' A S)
        sd = degrees @ s  # S' d, length k
        spectral = -(intra - (sd * sd).sum() / two_m) / two_m
    collapse = s.sum(dim=0).norm() / n * math.sqrt(k) - 1.0
    total = spectral + collapse_regularization * collapse
    if return_terms:
        return total, spectral, collapse
    return total


def dmon_epochs(model: DMoNModel, opt: torch.optim.Optimizer, x: Tensor, edge_index: Tensor, edge_weight: Tensor,
                epochs: int, collapse_regularization: float) -> list[float]:
    """``epochs`` full-batch steps of ``opt`` on the DMoN loss, the model in train mode (dropout on);
    returns the loss of every epoch."""
    history: list[float] = []
    model.train()
    for _ in range(int(epochs)):
        opt.zero_grad()
        s = model(x, edge_index, edge_weight)
        loss = dmon_loss(s, edge_index, edge_weight, collapse_regularization)
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))
    return history


def train_dmon(
    x: Any,
    adj: Any,
    k: int,
    seed: int,
    epochs: int = 1000,
    lr: float = 1e-3,
    dropout: float = 0.5,
    hidden: int = 64,
    collapse_regularization: float = 1.0,
    weight_decay: float = 0.0,
    sparse_features: bool = False,
) -> tuple[np.ndarray, Any]:
    """Train DMoN centrally, full batch (Adam), and return ``(labels, model)``.

    ``labels = argmax_j S_ij`` of the trained model in eval mode (no dropout).
    ``x=None`` uses identity features; ``sparse_features`` feeds them to the
    GCN as a torch sparse COO tensor (same model, much faster on bag-of-words
    features). The per-epoch loss is kept in
    ``model.loss_history``. Model/loss: :class:`DMoNModel`,
    :func:`dmon_loss` (lambda = ``collapse_regularization``).
    """
    A = square_sparse(adj)
    n = A.shape[0]
    k = check_k(k, n)
    seed = check_seed(seed)
    _check_training(x, n, epochs, lr)
    torch.manual_seed(seed)
    xt = features_to_tensor(x, n)
    if sparse_features:
        xt = xt.to_sparse()
    edge_index, edge_weight = adj_to_edge_index(A)
    model = DMoNModel(xt.shape[1], k, hidden=hidden, dropout=dropout)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    history = dmon_epochs(model, opt, xt, edge_index, edge_weight, epochs, collapse_regularization)
    model.eval()
    with torch.no_grad():
        s = model(xt, edge_index, edge_weight)
    model.loss_history = history
    return s.argmax(dim=1).numpy().astype(np.int64), model


def _check_training(x: Any, n: int, epochs: Any, lr: Any) -> None:
    """A whole number of epochs >= 0, a learning rate > 0 and features with one row per node."""
    if isinstance(epochs, bool) or int(epochs) < 0:
        raise ValueError(f"invalid epochs={epochs!r}; need an integer >= 0")
    if not lr > 0:
        raise ValueError(f"invalid lr={lr!r}; need lr > 0")
    if x is not None:
        as_features(x, n)


class GCN(nn.Module):
    """Two ``GCNConv`` layers (hidden 16, ReLU, dropout 0.5) to per-node class scores."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.hidden = 16
        with generated_files_removed():
            self.conv1 = GCNConv(in_dim, self.hidden)
            self.conv2 = GCNConv(self.hidden, num_classes)

    def embed(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return torch.relu(self.conv1(x, edge_index))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = F.dropout(self.embed(x, edge_index), 0.5, self.training)
        return self.conv2(h, edge_index)


class GIN(nn.Module):
    """``layers`` ``GINConv`` layers (MLP Linear-BatchNorm-ReLU-Linear, then BatchNorm and ReLU),
    then two linear layers (ReLU, dropout 0.5) to per-node class scores."""

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 64, layers: int = 5):
        super().__init__()
        from torch_geometric.nn import GINConv

        self.hidden = hidden
        dims = [in_dim] + [hidden] * layers
        with generated_files_removed():
            self.convs = nn.ModuleList(
                GINConv(nn.Sequential(nn.Linear(a, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                      nn.Linear(hidden, hidden)))
                for a in dims[:-1]
            )
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in dims[:-1])
        self.lin1 = nn.Linear(hidden, hidden)
        self.lin2 = nn.Linear(hidden, num_classes)

    def embed(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = x
        for conv, norm in zip(self.convs, self.norms):
            h = torch.relu(norm(conv(h, edge_index)))
        return h

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = torch.relu(self.lin1(self.embed(x, edge_index)))
        h = F.dropout(h, 0.5, self.training)
        return self.lin2(h)


GNN_MODELS = {"gcn": GCN, "gin": GIN}


def build_model(kind: str, in_dim: int, num_classes: int, seed: int) -> nn.Module:
    """A :class:`GCN` or :class:`GIN` (``kind``) with ``in_dim`` inputs and ``num_classes`` outputs,
    initialised under ``torch.manual_seed(seed)``."""
    if kind not in GNN_MODELS:
        raise ValueError(f"unknown model {kind!r}; valid choices: " + ", ".join(GNN_MODELS))
    torch.manual_seed(int(seed))
    return GNN_MODELS[kind](in_dim, num_classes)
