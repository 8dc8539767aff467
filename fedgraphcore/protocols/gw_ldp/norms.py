"""BatchNorm statistics of the union of the clients' training graphs.

After training, each BatchNorm layer's running mean and variance are set, layer
by layer in forward order (:func:`norm_layers`), to those of the union of the
clients' training-graph nodes, from the per-client moments ``[N_c, sum a,
sum a^2]`` of the layer's input (:func:`norm_input_moments`,
:func:`pooled_norm_statistics`): the same statistics as if one client held
every training graph.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .graphs import GraphBatch


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
