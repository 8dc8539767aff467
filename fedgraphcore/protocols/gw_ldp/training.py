"""Training the shared GNN: local epochs, local DP-SGD, client-level DP-FedAvg, FedAvg.

Local training (:func:`local_train`): ``E`` full-batch Adam epochs on the
client's training graphs (graph classification: cross-entropy of the pooled
score; k-hop subgraphs: cross-entropy of the centre node's score, the centre
label being the subgraph's pseudo-label). :func:`fedavg` is the plain weighted
average the strategy's Flower ``aggregate_arrayrecords`` computes (kept as the
reference for tests). Under training DP, :func:`dp_sgd_train` (one graph per
sample) or :func:`privatise_update` (a client's whole update), with the
mechanism :func:`training_mechanism` builds for client and server alike.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .graphs import GraphBatch, graph_slices
from .norms import freeze_norm_statistics
from .wire import GWLDPConfig


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


def trainable_names(model) -> set[str]:
    """Names of the model's trainable parameters (its other shared state: BatchNorm statistics)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


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
            _add_clipped_gradient(total, model, params, x, ei, int(labels[g]), task, clip)
        opt.zero_grad()
        for p, t in zip(params, total):
            noise = torch.normal(0.0, float(noise_multiplier) * float(clip), size=p.shape, generator=gen)
            p.grad = (t + noise) / expected
        opt.step()
    return int(steps)


def _add_clipped_gradient(total: list, model, params: list, x, edge_index, label: int, task: str,
                          clip: float) -> None:
    """Add one graph's own gradient, clipped to L2 norm ``clip`` over all ``params``, to ``total``."""
    import torch

    z = model(x, edge_index)
    z = z[:1] if task == "centre" else z.mean(0, keepdim=True)
    loss = torch.nn.functional.cross_entropy(z, torch.tensor([label]))
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(params, grads)]
    norm = torch.sqrt(sum((gr * gr).sum() for gr in grads))
    factor = min(1.0, float(clip) / max(float(norm), 1e-12))
    for t, gr in zip(total, grads):
        t.add_(gr, alpha=factor)


def privatise_update(start: dict[str, np.ndarray], new: dict[str, np.ndarray], trainable: set[str],
                     mechanism, rng) -> dict[str, np.ndarray]:
    """Client-level DP-FedAvg on one client's round: the update ``new - start``
    of the trainable parameters, as one vector, goes through ``mechanism``
    (clip to L2 ``clip`` + Gaussian noise, :class:`fedgraphcore.privacy.gaussian.GaussianMechanism`);
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


def predict_graphs(model, batch: GraphBatch, task: str) -> np.ndarray:
    """The GNN's own class predictions (for reference next to the SVC)."""
    import torch

    model.eval()
    with torch.no_grad():
        return _scores(model, batch, task, np.arange(batch.num_graphs)).argmax(1).numpy()


def training_mechanism(cfg: GWLDPConfig):
    """The Gaussian mechanism of the run's training DP (``cfg.dp``), None without it; the client
    noises with it and the server accounts with it.

    ``client`` (DP-FedAvg): clip the update to L2 ``dp-clip``, add N(0, (dp-noise dp-clip)^2) to
    every coordinate, one release per round, replace adjacency (a client's whole data).
    ``sgd`` (local DP-SGD): the same (sigma, q = dp-sample-rate) at every client and step, add/remove
    adjacency of one graph, so one accountant covers every client."""
    if cfg.dp == "none":
        return None
    from fedgraphcore.privacy.gaussian import GaussianMechanism

    sgd = cfg.dp == "sgd"
    return GaussianMechanism(cfg.dp_clip, cfg.dp_noise, sample_rate=cfg.dp_sample_rate if sgd else 1.0,
                             delta=cfg.dp_delta, adjacency="remove" if sgd else "replace")
