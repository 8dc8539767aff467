"""Node embeddings of the trained GNN and their LDP encoding (paper Algorithm 1).

The node embedding (:func:`node_embeddings`) is a softmax, so in ``[0, 1]``
(alpha = 0, beta = 1 as in the paper), of either the class scores
(``"classes"``: ``n x C``) or the last message-passing layer's output
(``"hidden"``: ``n x h``, h = 16 for GCN, 64 for GIN; the paper's ``H in
[alpha, beta]^(n x h)`` with h "the hidden dimension", Section 3.2).

LDP (:func:`encode_graph`): the multi-bit encoder of :mod:`fedgraphcore.privacy.ldp`
applied to the ``n x d`` embedding of one graph (d = h or C) with budget
``epsilon_g`` for the whole graph: each row gets ``epsilon_g / n`` and ``m =
max(1, min(d, floor(epsilon_g / 2.18)))`` sampled coordinates, so each sampled
entry is an ``epsilon_g/(m n)``-randomised response exactly as in Algorithm 1
and the ``n m`` entries compose to ``epsilon_g``-LDP for the graph's embedding.
Output: int8 codes in ``{-1, 0, +1}``, ``m`` non-zeros per row. The paper's
default is ``epsilon_g = 1/|V|``.
"""

from __future__ import annotations

import math

import numpy as np

from fedgraphcore.privacy.ldp import default_m, multibit_encode

from .graphs import GraphBatch
from .wire import EMBEDDING_LAYERS


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
