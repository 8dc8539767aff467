"""FedAvg-DMoN's exact-gradient training on the whole graph (``fedavg-dmon.aggregate=gradient``).

In the whole-graph mode (:mod:`fedgraphcore.protocols.fedavg_dmon.boundary`) every party's loss ``L_c``
is the whole graph's DMoN loss with the other parties' rows frozen, and at the weights the
frozen terms were computed under ::

    sum_c grad_W L_c(W_t) = grad_W L(W_t).

``aggregate=weights`` lets every party take ``local-epochs`` Adam steps on its ``L_c`` and
averages the weights (the frozen terms go stale within a round). ``aggregate=gradient`` makes
the federation *be* centralised full-batch training (:func:`fedgraphcore.models.train_dmon`): the server
keeps the model and one Adam optimiser (:class:`ServerAdam`, the same ``torch.optim.Adam``, lr,
no weight decay); each server step t

1. sends ``W_t``; every party answers the ``dmon_spread`` of ``W_t`` (its padded ``B_c S_c``
   and the masked global sums, ``S_c`` under this step's dropout mask);
2. sends every party its rows of those sums; every party answers the masked vector
   ``[grad_W L_c(W_t), <S_c, (A S)_c>, val_intra_c]`` (:func:`party_gradient`) under the same
   dropout mask as in 1 (the stream state kept before 1 draws it again, then advances);
3. unmasks the sum: the whole graph's gradient at ``W_t``, and ``Tr(S'AS)`` from which
   :func:`whole_loss` forms the whole graph's loss; one Adam step gives ``W_{t+1}``.

``num-rounds x local-epochs`` server steps: the epoch budget of centralised training. A step
needs two exchanges: the gradient at ``W_t`` needs the neighbour sums of ``S(W_t)`` (a secure
sum), and ``W_{t+1}`` needs the sum of the gradients (a second one), so neither reply can ride
with the other step's message.

Dropout: centralised training draws one mask over all n x k logits per epoch from the torch
stream seeded with ``seed`` (after the initialisation's draws). Every party replays that stream
(:func:`step_noise`: the same generator state, the same n x k draw; the seed is public) and
applies the mask's rows of its nodes: their global row numbers on a partitioned dataset, so the
summed gradient is the centralised epoch's gradient under the centralised mask, and the weights
equal centralised training's step for step up to float rounding, dropout included. On
``dataset=parties`` (no global row numbers) a party takes the rows at its positions: the same
mask distribution, another assignment of its rows to nodes than the pooled graph's order.

With one party (it holds the whole graph) nothing is linked or masked: it answers step 2 alone,
its float gradient of :func:`fedgraphcore.models.dmon_loss` on its own graph (:func:`local_gradient`).

Bound: every entry of the masked vector is clipped to the run's upload bound (the largest of
``secagg.bound`` and the parties' ``magnitude``). ``<S_c, (A S)_c>`` and ``val_intra_c`` are at most
the party's volume, within ``magnitude``; a gradient entry depends on the weights (the GCN output
is unbounded), so no data-independent bound exists: entries beyond it would be clipped, which
the run would show as a departure from the centralised loss (history ``grad_max`` records the
largest entry of each summed gradient; on cora and sbm it stays many orders of magnitude below).

Wire protocol, several parties (after the boundary links and ``dmon_features`` of
strategies/fedavg_dmon/boundary.py; what leaves a client in **bold**, every array masked), per
server step t:

1. ``query.dmon_spread`` with ``train``: down ``W_t`` (first step: with the features' padded
   rows); up **the padded ``B_c [S_c | Y_c]``** (``S_c`` under the step's dropout mask, ``Y_c`` the
   hard labels of ``W_t``) and **the masked sums** (as in weights mode).
2. ``train.dmon_gradient``: down each party's rows of 1's padded sum, the summed vector and the
   secure-sum values; up **the masked ``[grad_W L_c(W_t), <S_c, (A S)_c>, val_intra_c]``**
   (``val_intra_c`` 0 except at a round's first step with ``select=val-modularity``). The server
   learns the whole graph's gradient, its ``Tr(S'AS)`` (hence its loss) and validation count,
   nothing per party; one Adam step gives ``W_{t+1}``.

One party (it holds the whole graph): step 2 only, down ``W_t``; up **its float gradient and
loss** (and at a round's first step its validation score), nothing masked (the sum of one is
the upload).

Model selection as in ``mode=centralised``: ``W_t`` at every round's first step and the final
weights compete on the whole graph's validation modularity.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

DMON_GRADIENT = "dmon_gradient"
#: the upload (masked: the gradient then ``<S_c, (A S)_c>`` and ``val_intra_c``; one party: the gradient)
GRADIENT = "gradient"
#: flag in ``dmon_spread``'s values: ``S_c`` under this step's dropout mask (gradient mode)
TRAIN_FLAG = "train"


def gradient_mode(config) -> bool:
    """Whether a run trains by exact gradients (whole-graph mode with ``aggregate=gradient``)."""
    return fedavg_dmon_boundary.boundary_run(config) and str(config["fedavg-dmon.aggregate"]) == "gradient"


def gradient_size(shapes: Mapping[str, tuple[int, ...]]) -> int:
    return sum(int(np.prod(s)) for s in shapes.values())


def gradient_reply(shapes: Mapping[str, tuple[int, ...]], masked: bool, scored: bool) -> ReplySpec:
    """``dmon_gradient``: the masked vector (gradient + 2 counts), or one party's float gradient, its
    loss and (``scored``) the validation score of ``W_t``."""
    size = gradient_size(shapes)
    if masked:
        return ReplySpec(arrays={GRADIENT: ArraySpec((size + 2,), "u", masked=True)})
    numbers = {"loss": ValueSpec(), **(fedavg_dmon.SCORE_SPEC if scored else {})}
    return ReplySpec(arrays={GRADIENT: ArraySpec((size,), "f")}, numbers=numbers)


class ServerAdam:
    """The server's model and optimiser: ``torch.optim.Adam(lr, weight_decay=0)`` over float32
    parameters in :data:`fedgraphcore.protocols.fedavg_dmon.PARAM_NAMES` order, as in centralised training."""

    def __init__(self, weights: Mapping[str, np.ndarray], lr: float):
        import torch

        self.shapes = {n: tuple(np.shape(weights[n])) for n in fedavg_dmon.PARAM_NAMES}
        self.params = [torch.nn.Parameter(torch.tensor(np.asarray(weights[n], dtype=np.float32)))
                       for n in fedavg_dmon.PARAM_NAMES]
        self.opt = torch.optim.Adam(self.params, lr=lr, weight_decay=0.0)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy().copy() for n, p in zip(fedavg_dmon.PARAM_NAMES, self.params)}

    def step(self, gradient: np.ndarray) -> dict[str, np.ndarray]:
        """One Adam step on ``gradient`` (flat, :func:`fedgraphcore.protocols.fedavg_dmon.flatten` order,
        taken as float32 like a parameter's ``.grad``); returns the new weights."""
        import torch

        for p, (name, g) in zip(self.params, fedavg_dmon.unflatten(np.asarray(gradient), self.shapes).items()):
            p.grad = torch.from_numpy(g)
        self.opt.step()
        return self.weights


def whole_loss(intra: float, totals: np.ndarray, k: int, n: int, collapse: float) -> float:
    """The whole graph's DMoN loss from ``Tr(S'AS)`` and the spread's summed vector (``S'd``, ``t``, 2m)."""
    sd, sizes, two_m = totals[:k], totals[k: 2 * k], float(totals[3 * k])
    spectral = -(intra - float(sd @ sd) / two_m) / two_m if two_m > 0 else 0.0
    return float(spectral + collapse * (np.linalg.norm(sizes) / n * math.sqrt(k) - 1.0))


def _in_stream(rng, fn):
    """``fn()`` with the torch CPU generator at ``rng`` (uint8 state); returns its result and the
    generator state after it, the caller's own state untouched."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(torch.from_numpy(np.asarray(rng, dtype=np.uint8)))
        out = fn()
        return out, torch.get_rng_state().numpy().copy()


def step_noise(rng, n: int, k: int, dropout: float, rows: np.ndarray):
    """``(noise rows, rng after)``: the dropout multipliers (0 or ``1/(1-p)``) that centralised
    training's epoch draws for all ``n x k`` logits from the stream at ``rng`` (``F.dropout`` draws
    its mask by shape alone), at ``rows``; ``None`` without dropout (no draw)."""
    import torch
    import torch.nn.functional as F

    if dropout <= 0:
        return None, rng
    noise, rng = _in_stream(rng, lambda: F.dropout(torch.ones(n, k), p=dropout, training=True))
    return noise[torch.as_tensor(np.asarray(rows, dtype=np.int64))], rng


def _loaded(weights, f: int, k: int, hidden: int, dropout: float):
    model = fedavg_dmon.shared_model(f, k, hidden, dropout)
    fedavg_dmon.set_weights(model, weights)
    model.train()
    model.zero_grad(set_to_none=True)
    return model


def _assign(model, x, no_edges, noise):
    """``S = softmax(logits * noise)`` (``DMoNModel.forward`` with a given dropout mask)."""
    import torch
    import torch.nn.functional as F

    logits = model.head(F.selu(model.conv(x, no_edges)))
    return torch.softmax(logits if noise is None else logits * noise, dim=-1)


def _flat_gradient(model) -> np.ndarray:
    named = dict(model.named_parameters())
    return np.concatenate([named[n].grad.detach().numpy().astype(np.float64).ravel() for n in fedavg_dmon.PARAM_NAMES])


def dropped_assign(weights, g: fedavg_dmon_boundary.PartyGraph, k: int, hidden: int, noise) -> np.ndarray:
    """``S_c`` under ``weights`` and this step's dropout multipliers ``noise`` (its rows), float64: what
    the party's gradient-mode spread multiplies."""
    import torch

    model = _loaded(weights, g.x.shape[1], k, hidden, 0.0)
    with torch.no_grad():
        return _assign(model, g.x, g.no_edges, noise).numpy().astype(np.float64)


def party_gradient(weights, g: fedavg_dmon_boundary.PartyGraph, neighbour_sums: np.ndarray, adj_train, totals: np.ndarray,
                   n: int, k: int, hidden: int, noise, collapse: float) -> tuple[np.ndarray, float]:
    """``(grad_W L_c(W_t), <S_c, (A S)_c>)``: the party's share of the whole graph's gradient (flat
    float64) under the dropout multipliers ``noise``, from its rows ``(A S)_c`` of the spread and the
    summed vector ``totals``."""
    model = _loaded(weights, g.x.shape[1], k, hidden, 0.0)
    s = _assign(model, g.x, g.no_edges, noise)
    s_np = s.detach().numpy().astype(np.float64)
    frozen = fedavg_dmon_boundary.frozen_terms(neighbour_sums, s_np, adj_train, g.degrees.numpy(), totals, n)
    fedavg_dmon_boundary.party_loss(s, g, frozen, collapse).backward()
    return _flat_gradient(model), float((s_np * neighbour_sums).sum())


def local_gradient(weights, graph: fedavg_dmon.Graph, k: int, hidden: int, dropout: float, collapse: float, rng):
    """``(grad_W L(W_t), L(W_t), rng after)`` on the party's own graph (one party: the whole graph),
    the forward and loss of :func:`fedgraphcore.models.dmon_epochs`."""
    from fedgraphcore.models import dmon_loss

    model = _loaded(weights, int(np.shape(weights["conv.lin.weight"])[1]), k, hidden, dropout)

    def backward():
        loss = dmon_loss(model(graph.x, graph.edge_index, graph.edge_weight), graph.edge_index, graph.edge_weight,
                         collapse)
        loss.backward()
        return float(loss.detach())

    loss, rng = _in_stream(rng, backward)
    return _flat_gradient(model), loss, rng
