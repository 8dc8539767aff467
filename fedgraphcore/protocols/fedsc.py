"""FedSC: federated spectral clustering by secure similarity reconstruction.

Qiao, Ding & Fan (2023), with the algorithm details of the authors' code
(``../shared/papers/NOTES.md``). Plain numpy/scipy functions, no Flower.
The kernel width follows NOTES.md (``2 sigma^2`` with sigma the mean pairwise
distance; the slides write ``r^2``).

Notation (rows are samples, unlike the paper's columns): client ``p`` holds
``X_p`` (``N_p x m``); the shared landmarks are ``Z`` (``d x m``); client
``p``'s coefficients are ``C_p`` (``d x N_p``). Gaussian kernel
``k(x, y) = exp(-||x - y||^2 / (2 sigma^2))`` so ``phi(x)' phi(y) = k(x, y)``.
The federated problem is

    min_{Z, C}  sum_p f_p(Z, C_p),
    f_p = 1/2 ||phi(X_p) - phi(Z) C_p||_F^2 + lambda/2 ||C_p||_F^2
        = 1/2 [N_p - 2 tr(C_p' K_zx) + tr(C_p' K_zz C_p)] + lambda/2 ||C_p||_F^2.

One round (:func:`client_round`): with the averaged ``Z`` from the server the
client solves ``C_p = (K_zz + lambda I)^-1 K(Z, X_p)`` in closed form, then
takes one preconditioned gradient step on its copy of ``Z`` and uploads it
(:func:`landmark_step`). The server averages the uploads (:func:`average`).

At the end the clients upload ``C_p``; the server forms
``K_hat = C' K(Z, Z) C`` (``C = [C_1 ... C_P]``, ``n x n``; it approximates
the full kernel matrix ``K(X, X)`` without receiving any ``x``, though
noise-free factors determine the samples: :func:`invert_coefficients`), scales it to
[0, 1], keeps the ``ceil(ln n)`` largest entries of each row (symmetrised by
max) and runs normalised spectral clustering (:func:`cluster_affinity`).

Wire protocol (what leaves a client, step by step):

1. with ``hello`` (down: whether to estimate) -> up: value ``features``
   (the dimension m) and, only when ``fedsc.sigma = 0``, ``distance_sum`` and
   ``pairs`` (sum and number of the pairwise distances among the client's
   own samples, in the clear). The server sets sigma = sum / pairs.
2. ``fedsc_rank`` (down: sigma, mass), only when ``fedsc.landmarks = 0`` ->
   up: value ``landmarks``, the spectral-mass count of the client's own kernel
   matrix, in the clear (a whole number from 1 to the client's own samples,
   its kernel's largest possible rank, else the run stops naming the client).
   The server takes the largest.
3. ``fedsc_round`` x ``num-rounds`` (down: ``z`` = current landmarks Z, sigma,
   lambda) -> up: ``update`` = ``[Z_p.ravel(), f_p]``: the client's landmarks
   after its C-step and one preconditioned Z-step, and its objective value
   (one number; left out under ``fedsc.dp-epsilon`` and ``fedsc.noise-z``,
   which noise only Z_p). With ``fedsc.secure``
   the vector is pairwise masked (secagg ring) and the server learns only the sum
   over clients, i.e. the average Z. With ``fedsc.noise-z`` / ``dp-epsilon``
   Z_p is noised before it leaves.
4. ``fedsc_final`` (down: final Z) -> up: ``c`` = C_p (d x N_p, noised with
   ``fedsc.noise-c`` / ``dp-epsilon``) and ``node_ids`` (global ids of the
   client's samples, for evaluation only; below the samples announced in
   hello and, without ``partition.overlap``, on one client each). The server forms
   ``C' K(Z, Z) C``, scales it to [0, 1], keeps ceil(ln n) neighbours per row
   (symmetrised by max) and runs normalised spectral clustering (a
   non-finite ``C' K(Z, Z) C``, from uploads far out of range, stops the run).
5. ``labels`` (down: the labels of the client's own samples) -> up: a count.

No sample ``x`` is ever sent, but the factors are functions of the samples,
and noise-free they reveal them: from ``Z``, sigma and a column ``c_i`` the
server gets ``k(Z, x_i) = (K_zz + lambda I) c_i``, i.e. the distances of
``x_i`` to ``d >= m + 1`` landmarks, and recovers ``x_i`` exactly
(:func:`fedgraphcore.protocols.fedsc.invert_coefficients`, tested). Secure
aggregation hides the individual ``Z_p`` only. Protection against the server
therefore needs one of the noise variants, all drawn from the client's own
operating-system entropy (nothing the server knows, such as the seed or the
client id, can regenerate them):

* ``fedsc.data-noise``: each client perturbs its own samples once,
  ``X + ratio * std(X) * N(0,1)``, and then runs the protocol on them. With
  noise-free factors the server still recovers the *perturbed* samples
  exactly; only this noise stands between it and ``X``. Recorded in the
  ledger as heuristic noise with no formal guarantee.
* ``fedsc.noise-z`` / ``fedsc.noise-c``: the paper's factor-perturbation
  ratios on Z_p and C_p; heuristic as well (no formal guarantee).
* ``fedsc.dp-epsilon``: clip + calibrated Gaussian noise on every Z_p upload
  and on C_p; the Opacus accountant reports (epsilon, delta), see
  :meth:`FedSC._dp_mechanisms`. It requires ``fedsc.sigma`` and
  ``fedsc.landmarks`` to be given, so that steps 1 and 2 upload no statistic
  of the samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError, ConfigView, RunConfig, SharedConfig, setting
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

# -- wire: the protocol's steps and what a valid reply holds ------------------------------
#: the release of the bandwidth statistics, which go with the hello reply (no step of their own)
FEDSC_BANDWIDTH = "fedsc_bandwidth"
FEDSC_RANK = "fedsc_rank"
FEDSC_ROUND = "fedsc_round"
FEDSC_FINAL = "fedsc_final"

#: ``fedsc_rank``: the spectral-mass landmark count of the client's own kernel (at least 1).
RANK_REPLY = ReplySpec(numbers={"landmarks": ValueSpec(whole=True, low=1)})

#: A reply that only acknowledges (the final ``labels``).
RECEIVED_REPLY = ReplySpec(values=("received",))


def bandwidth_reply(estimate: bool) -> ReplySpec:
    """The hello figures of ``fedsc``: ``features`` (the dimension m); when sigma is estimated also
    ``distance_sum`` and ``pairs``."""
    numbers = {"features": ValueSpec(whole=True, low=1)}
    if estimate:
        numbers.update(distance_sum=ValueSpec(low=0), pairs=ValueSpec(whole=True, low=0))
    return ReplySpec(numbers=numbers)


def update_bound(rows: int, value_bound: float) -> float:
    """The largest |entry| of the ``update`` of a client with ``rows`` samples: a landmark coordinate,
    at most ``value_bound`` (``secagg.bound``), or its objective ``f_p``, at most ``N_p / 2`` (its
    value at ``C_p = 0``, above the minimum the C-step reaches); so the bound holds at every size."""
    return max(float(value_bound), float(rows))


def round_reply(size: int, secure: bool, noised: bool) -> ReplySpec:
    """``update``: ``[Z_p.ravel(), f_p]`` (``f_p`` left out when ``noised``) in one vector of ``size``;
    masked integers when ``secure``."""
    return ReplySpec(arrays={"update": ArraySpec((size,), kind="u" if secure else "f", masked=secure,
                                                 noised=noised)})


def final_reply(landmarks: int, rows: int, noised: bool) -> ReplySpec:
    """``c`` = C_p (one column per sample the client announced) and the samples' ``node_ids``."""
    return ReplySpec(arrays={"c": ArraySpec((landmarks, rows), noised=noised),
                             "node_ids": ArraySpec((rows,), kind="iu", low=0, unique=True)})


# -- run-config keys ------------------------------------------------------------------------
#: singular-value mass the landmark count must carry on a client's own kernel. The authors take 99%
#: of the full kernel's mass; a client's kernel is a principal submatrix of it and reaches 99% with
#: fewer landmarks than the full one needs (see :func:`combine_landmark_counts`), so the local rule
#: asks for 99.9%.
AUTHORS_MASS = 0.99
DEFAULT_MASS = 0.999
DEFAULT_LAMBDA = 1e-4

#: Bandwidths whose 2 sigma^2 is a normal float64 (a smaller one makes every
#: kernel entry 0/0, a larger one every entry 1).
SIGMA_RANGE = (1e-150, 1e150)


@dataclass(frozen=True)
class FedSCConfig(ConfigView):
    """The ``fedsc.*`` keys of :class:`strategies.fedsc.FedSC` and its client, declared here. ``lambda_`` reads
    ``fedsc.lambda`` (a trailing ``_`` keeps a Python keyword out of the field name)."""

    prefix: ClassVar[str] = "fedsc"
    landmarks: int = setting(0, "landmarks d (0: spectral-mass rule on each client's kernel, largest count)",
                             low=0, high=100_000, primary=True)
    mass: float = setting(DEFAULT_MASS, "spectral-mass rule: fraction of the singular-value mass d landmarks must "
                          "carry on each client's kernel (the authors: 0.99 of the full kernel's; a client's smaller "
                          "kernel needs more)", low=1e-6, high=1.0, primary=True)
    lambda_: float = setting(DEFAULT_LAMBDA, "ridge weight lambda of the coefficients C", low=0.0, high=1e6)
    sigma: float = setting(0.0, "Gaussian kernel bandwidth (0: mean pairwise distance, estimated from the clients)",
                           low=0.0, high=SIGMA_RANGE[1], primary=True)
    secure: bool = setting(False, "secure aggregation of the landmark uploads Z_p")
    filter_order: int = setting(0, "graph data: AGC low-pass filter order applied to each client's features first",
                                low=0, high=1000)
    data_noise: float = setting(0.0, "perturbed data: each client uses X + ratio * std(X) * N(0,1) (paper: 0.3, 0.7)",
                                low=0.0, high=1e6)
    noise_z: float = setting(0.0, "perturbed factors: Z_p noise ratio alpha_z each round", low=0.0, high=1e6)
    noise_c: float = setting(0.0, "perturbed factors: C_p noise ratio alpha_c at the end", low=0.0, high=1e6)
    dp_epsilon: float = setting(0.0, "calibrated Gaussian mechanism on Z_p and C_p with this total epsilon (0: off; "
                                "needs fedsc.sigma and fedsc.landmarks set, so that no un-noised statistic leaves a "
                                "client; at most 1e4, as fedavg-dmon.dp-epsilon)", low=0.0, high=1e4)
    dp_delta: float = setting(1e-5, "total delta of the calibrated mechanism", low=1e-12, high=0.5)
    dp_clip_z: float = setting(100.0, "L2 clip of each client's whole Z_p upload (client-level unit)",
                               low=1e-9, high=1e12)
    dp_clip_c: float = setting(10.0, "L2 clip of each sample's coefficient column c_i (sample-level unit)",
                               low=1e-9, high=1e12)
    n_init: int = setting(10, "k-means restarts in the final spectral clustering", low=1, high=1000)

    @classmethod
    def key(cls, name: str) -> str:
        return super().key(name.rstrip("_"))


def dp_mechanism(cfg: FedSCConfig, which: str, noise_multiplier: float):
    """The calibrated Gaussian mechanism of upload ``which`` ("z": Z_p, the whole array clipped at
    ``fedsc.dp-clip-z``; "c": C_p, each sample's column clipped at ``fedsc.dp-clip-c``), at half
    ``fedsc.dp-delta`` (the total is split over the two): the server accounts with it, a client
    noises with it and checks the requested multiplier against its own budget."""
    from fedgraphcore.privacy.gaussian import GaussianMechanism

    clip = cfg.dp_clip_z if which == "z" else cfg.dp_clip_c
    return GaussianMechanism(clip, noise_multiplier, delta=cfg.dp_delta / 2, per_row=which == "c")


def client_features(shard, cfg: FedSCConfig, rng: np.random.Generator) -> np.ndarray:
    """What a client clusters: its (filtered) feature rows, perturbed with
    ``fedsc.data-noise`` drawn from ``rng`` (a client passes a generator on
    fresh OS entropy; only the evaluation's :func:`pooled_features` passes a
    seeded one)."""
    from fedgraphcore.graph_filters import filtered_features

    if shard.x is None:
        raise ConfigError(f"dataset '{shard.dataset}' has no features; fedsc clusters feature rows")
    x = filtered_features(shard.x, shard.adj, cfg.filter_order)
    if cfg.data_noise > 0:
        x = perturb(x, cfg.data_noise, rng)
    return x


def pooled_features(data, config: RunConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """Evaluation only: every client's features stacked (client order), their
    global ids and the sigma the clients would agree on for these features.

    With ``fedsc.data-noise`` > 0 each block is perturbed from
    :func:`reference_rng` (seed, client): the same mechanism as on the clients,
    a different draw (the clients' noise comes from their own entropy),
    reproducible for a seed.
    """
    from fedgraphcore.data.params import partition_kwargs
    from fedgraphcore.data.partition import partition

    cfg, shared = FedSCConfig.of(config), SharedConfig.of(config)
    shards = partition(data, shared.partitioner, shared.num_clients, seed=shared.seed,
                       **partition_kwargs(shared.partitioner, config.as_dict()))
    xs = [client_features(s, cfg, reference_rng(shared.seed, s.client_id)) for s in shards]
    ids = np.concatenate([np.asarray(s.node_ids, dtype=np.int64) for s in shards])
    if cfg.sigma > 0:
        sigma = cfg.sigma
    else:
        sums, pairs = zip(*(local_distance_sum(x) for x in xs))
        sigma = combine_bandwidth(sums, pairs)
    return np.vstack(xs), ids, sigma

# ---------------------------------------------------------------------------
# kernel, bandwidth, landmark count
# ---------------------------------------------------------------------------
def sq_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``a`` and ``b`` (>= 0)."""
    d2 = (a * a).sum(1)[:, None] - 2.0 * a @ b.T + (b * b).sum(1)[None, :]
    return np.maximum(d2, 0.0)


def kernel(a: np.ndarray, b: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian kernel matrix ``K[i, j] = exp(-||a_i - b_j||^2 / (2 sigma^2))``."""
    return np.exp(-sq_distances(a, b) / (2.0 * sigma * sigma))


def local_distance_sum(x: np.ndarray) -> tuple[float, float]:
    """Client: sum of the pairwise distances of its own rows and the number of pairs.

    Only these two numbers leave the client; :func:`combine_bandwidth` turns
    them into the shared sigma.
    """
    n = len(x)
    if n < 2:
        return 0.0, 0.0
    d = np.sqrt(sq_distances(x, x)[np.triu_indices(n, 1)])
    return float(d.sum()), float(d.size)


def combine_bandwidth(sums, pairs) -> float:
    """Server: sigma = mean distance over all within-client pairs.

    With one client this is exactly the mean pairwise distance of the data
    (the authors' choice); with samples split at random it is an unbiased
    estimate of it.
    """
    total = float(np.sum(pairs))
    if total <= 0:
        raise ValueError("no client holds two samples; cannot estimate the kernel bandwidth")
    sigma = float(np.sum(sums)) / total
    if not sigma > 0:
        raise ValueError("all samples coincide (mean pairwise distance 0); cannot set the kernel bandwidth")
    return sigma


def mass_rank(k: np.ndarray, mass: float = DEFAULT_MASS) -> int:
    """Smallest ``d`` whose ``d`` largest singular values of ``k`` carry ``mass`` of their sum."""
    s = np.linalg.svd(k, compute_uv=False)
    total = s.sum()
    if total <= 0:
        return 1
    return int(np.searchsorted(np.cumsum(s) / total, mass - 1e-12) + 1)


def local_landmark_count(x: np.ndarray, sigma: float, mass: float = DEFAULT_MASS) -> int:
    """Client: the spectral-mass rule applied to its own kernel matrix ``K(X_p, X_p)``."""
    return mass_rank(kernel(x, x, sigma), mass)


def combine_landmark_counts(counts) -> int:
    """Server: the largest local count.

    A local kernel is a principal submatrix of the full one, and the full
    kernel usually needs more landmarks for the same mass (digits, 8 clients:
    largest local count at 99% 119, full kernel at 99% 287; Iris 6-7 vs 7). At the
    default 99.9% the largest local count is 200 on digits with 8 clients, 368
    with 4, 11-13 on Iris (``benchmarks/defaults.py``, RESULTS.md); for a
    high-rank kernel over many small clients it can still fall short of the
    full kernel's count, and ``fedsc.landmarks`` should be set (the authors
    hand-picked d as well).
    """
    return int(max(1, max(int(c) for c in counts)))


def init_landmarks(d: int, m: int, seed: int) -> np.ndarray:
    """Initial landmarks ``Z ~ N(0, 1)`` (``d x m``), as in the authors' code."""
    return np.random.default_rng([int(seed), 7]).standard_normal((int(d), int(m)))


# ---------------------------------------------------------------------------
# client round
# ---------------------------------------------------------------------------
def solve_coefficients(x: np.ndarray, z: np.ndarray, sigma: float, lam: float = DEFAULT_LAMBDA) -> np.ndarray:
    """C-step: ``C_p = argmin_C f_p(Z, C) = (K_zz + lambda I)^-1 K(Z, X_p)`` (``d x N_p``)."""
    return _solve(kernel(z, z, sigma), kernel(z, x, sigma), lam)


def _solve(kzz: np.ndarray, kzx: np.ndarray, lam: float) -> np.ndarray:
    a = kzz + lam * np.eye(len(kzz))
    try:
        return np.linalg.solve(a, kzx)
    except np.linalg.LinAlgError:  # exactly singular (duplicate landmarks and lam = 0)
        return np.linalg.lstsq(a, kzx, rcond=None)[0]


def _fit(n: int, kzz: np.ndarray, kzx: np.ndarray, c: np.ndarray, lam: float, g: np.ndarray | None = None) -> float:
    """``f_p`` from precomputed kernel blocks (``g = C C'`` when already known:
    ``tr(C' K_zz C) = sum(K_zz o C C')``)."""
    g = c @ c.T if g is None else g
    fit = n - 2.0 * float(np.sum(c * kzx)) + float(np.sum(kzz * g))
    return 0.5 * fit + 0.5 * lam * float(np.trace(g))


def objective(x: np.ndarray, z: np.ndarray, c: np.ndarray, sigma: float, lam: float = DEFAULT_LAMBDA) -> float:
    """``f_p(Z, C_p)`` (the kernel's diagonal is 1, so ``||phi(X_p)||^2 = N_p``)."""
    return _fit(len(x), kernel(z, z, sigma), kernel(z, x, sigma), c, lam)


def _blocks(x, z, c, sigma, kzz=None, kzx=None, g=None):
    kzz = kernel(z, z, sigma) if kzz is None else kzz
    kzx = kernel(z, x, sigma) if kzx is None else kzx
    g = c @ c.T if g is None else g
    return kzz, kzx, c * kzx, g * kzz


def landmark_gradient(x: np.ndarray, z: np.ndarray, c: np.ndarray, sigma: float,
                      kzz: np.ndarray | None = None, kzx: np.ndarray | None = None,
                      g: np.ndarray | None = None):
    """Gradient of ``f_p`` in ``Z``, its linear part ``A`` and a diagonal preconditioner.

    With ``W = C o K_zx`` and ``V = (C C') o K_zz`` (``o`` elementwise; using
    ``d k(z, y) / dz = k(z, y) (y - z) / sigma^2``),

        grad = (1/sigma^2) (A Z - W X),   A = diag(W 1 - V 1) + V      (d x m).

    Returns ``(grad, A, h)`` with ``h = (|W| 1 + |V| 1) / sigma^2`` (one
    positive number per landmark, the fallback preconditioner).
    ``kzz``/``kzx``/``g = C C'`` may be passed when already computed.
    """
    _, _, w, v = _blocks(x, z, c, sigma, kzz, kzx, g)
    a = np.diag(w.sum(1) - v.sum(1)) + v
    s2 = sigma * sigma
    grad = (a @ z - w @ x) / s2
    h = (np.abs(w).sum(1) + np.abs(v).sum(1)) / s2
    return grad, a, h


def landmark_step(
    x: np.ndarray,
    z: np.ndarray,
    c: np.ndarray,
    sigma: float,
    lam: float = DEFAULT_LAMBDA,
    max_halvings: int = 20,
    kzz: np.ndarray | None = None,
    kzx: np.ndarray | None = None,
) -> np.ndarray:
    """Z-step: one preconditioned gradient step on ``f_p(., C_p)``.

    The gradient ``(1/sigma^2)(A Z - W X)`` is linear in ``Z`` when the kernel
    values are frozen; the preconditioned step ``Z - sigma^2 A^-1 grad =
    A^-1 W X`` solves that linear system (a Newton step with frozen kernel
    terms). Backtracking halves the step (at most ``max_halvings`` times)
    until the local objective decreases; if ``A`` is singular or no step
    decreases it, the diagonal preconditioner ``h`` is tried the same way, and
    failing that ``Z`` is returned unchanged. So ``f_p(Z_p, C_p) <= f_p(Z, C_p)``.
    """
    kzz = kernel(z, z, sigma) if kzz is None else kzz
    kzx = kernel(z, x, sigma) if kzx is None else kzx
    g = c @ c.T
    grad, a, h = landmark_gradient(x, z, c, sigma, kzz, kzx, g)
    f0 = _fit(len(x), kzz, kzx, c, lam, g)
    directions = []
    try:
        directions.append(np.linalg.solve(a, grad * sigma * sigma))
    except np.linalg.LinAlgError:
        pass
    directions.append(grad / np.maximum(h, 1e-300)[:, None])
    for direction in directions:
        if not np.all(np.isfinite(direction)):
            continue
        step = 1.0
        for _ in range(max_halvings + 1):
            new = z - step * direction
            if _fit(len(x), kernel(new, new, sigma), kernel(new, x, sigma), c, lam, g) < f0:
                return new
            step *= 0.5
    return z.copy()


def client_round(x: np.ndarray, z: np.ndarray, sigma: float, lam: float = DEFAULT_LAMBDA):
    """One client round: ``C_p`` in closed form, then one Z-step.

    Returns ``(C_p, Z_p, f_p(Z, C_p))``: ``Z_p`` is uploaded, ``C_p`` stays on
    the client until the end, ``f_p`` (one number) is uploaded for the
    objective history.
    """
    with _one_thread():
        kzz = kernel(z, z, sigma)
        kzx = kernel(z, x, sigma)
        c = _solve(kzz, kzx, lam)
        f = _fit(len(x), kzz, kzx, c, lam)
        return c, landmark_step(x, z, c, sigma, lam, kzz=kzz, kzx=kzx), f


_CONTROLLER = None


def _one_thread():
    """BLAS on one thread: these products are small, and thread spin-waits on a
    shared machine make them several times slower. (The controller scans the
    loaded libraries once: ~40 ms, too slow to repeat every round.)"""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1)


def average(zs) -> np.ndarray:
    """Server: ``Z = (1/P) sum_p Z_p``."""
    zs = list(zs)
    return np.sum(zs, axis=0) / len(zs)


# ---------------------------------------------------------------------------
# noise
# ---------------------------------------------------------------------------
def perturb(array: np.ndarray, ratio: float, rng) -> np.ndarray:
    """The paper's rule ``M + ratio * std(M) * N(0, 1)`` (no formal guarantee)."""
    from fedgraphcore.privacy.gaussian import noise_ratio_perturb

    if ratio <= 0:
        return np.asarray(array, dtype=np.float64)
    return noise_ratio_perturb(array, ratio, rng)


def reference_rng(seed: int, client: int) -> np.random.Generator:
    """Evaluation only: the centralised reference's ``fedsc.data-noise`` draw for
    one client's block, reproducible from (run seed, client).

    Never used by a client: a client's noise comes from its own OS entropy,
    since the server knows the seed and the client id and could regenerate
    (and subtract) any noise seeded from them.
    """
    return np.random.default_rng([int(seed), int(client), 1, 0xFEDC])


# ---------------------------------------------------------------------------
# reconstruction and spectral clustering
# ---------------------------------------------------------------------------
def reconstruct(z: np.ndarray, c: np.ndarray, sigma: float) -> np.ndarray:
    """``K_hat = C' K(Z, Z) C`` (``n x n``) from the landmarks and all coefficients."""
    return c.T @ (kernel(z, z, sigma) @ c)


def knn_count(n: int) -> int:
    """Neighbours kept per row: ``ceil(ln n)`` (at least 1, at most n - 1)."""
    return int(min(max(1, math.ceil(math.log(max(n, 2)))), max(n - 1, 1)))


def knn_affinity(k_hat: np.ndarray, neighbours: int | None = None) -> sp.csr_matrix:
    """Min-max scale ``k_hat`` to [0, 1], keep each row's ``neighbours`` largest
    off-diagonal entries, symmetrise by max (sparse ``n x n``).

    Vectorised: one ``argpartition`` over the rows.
    """
    k_hat = np.asarray(k_hat, dtype=np.float64)
    n = k_hat.shape[0]
    if n < 2:
        return sp.csr_matrix((n, n))
    lo, hi = float(k_hat.min()), float(k_hat.max())
    scaled = (k_hat - lo) / (hi - lo) if hi > lo else np.ones_like(k_hat)
    q = knn_count(n) if neighbours is None else int(neighbours)
    masked = scaled.copy()
    np.fill_diagonal(masked, -np.inf)
    cols = np.argpartition(-masked, q - 1, axis=1)[:, :q]
    rows = np.repeat(np.arange(n), q)
    cols = cols.ravel()
    w = sp.csr_matrix((scaled[rows, cols], (rows, cols)), shape=(n, n))
    return w.maximum(w.T).tocsr()


def cluster_affinity(k_hat: np.ndarray, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Normalised spectral clustering of the kNN graph of ``k_hat`` (NJW, :func:`fedgraphcore.clustering.spectral_affinity`)."""
    from fedgraphcore.clustering import spectral_affinity

    return spectral_affinity(knn_affinity(k_hat), int(k), int(seed), n_init=n_init)


def centralised_sc(x: np.ndarray, sigma: float, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """The reference: the same pipeline on the exact kernel ``K(X, X)`` of the pooled data."""
    return cluster_affinity(kernel(x, x, sigma), k, seed, n_init)


# ---------------------------------------------------------------------------
# what the server can infer (evaluation of the privacy claim)
# ---------------------------------------------------------------------------
def invert_coefficients(z: np.ndarray, c: np.ndarray, sigma: float, lam: float = DEFAULT_LAMBDA) -> np.ndarray:
    """Samples recovered from noise-free factors: the server's reconstruction attack.

    The server knows Z, sigma and lambda, so from a coefficient column it gets
    ``k(Z, x_i) = (K_zz + lambda I) c_i`` exactly, hence the squared distances
    ``s_j = -2 sigma^2 ln k(z_j, x_i) = ||z_j||^2 - 2 z_j' x_i + ||x_i||^2``:
    linear in ``(x_i, ||x_i||^2)``. With ``d >= m + 1`` landmarks in general
    position, least squares returns ``x_i`` (``n x m``). FedSC without noise
    on C therefore does not hide the samples from the server; only the
    perturbed or DP variants do (tests/test_fedsc.py measures this).
    """
    k = (kernel(z, z, sigma) + lam * np.eye(len(z))) @ c  # d x n
    s = -2.0 * sigma * sigma * np.log(np.clip(k, 1e-300, None))
    a = np.hstack([-2.0 * z, np.ones((len(z), 1))])
    weights = np.clip(k, 0.0, 1.0)  # far landmarks (k ~ 0) carry little information
    out = np.empty((c.shape[1], z.shape[1]))
    for i in range(c.shape[1]):
        w = np.sqrt(weights[:, i])
        sol = np.linalg.lstsq(a * w[:, None], (s[:, i] - (z * z).sum(1)) * w, rcond=None)[0]
        out[i] = sol[:-1]
    return out


# ---------------------------------------------------------------------------
# the whole protocol in memory (same functions, no transport)
# ---------------------------------------------------------------------------
def simulate(
    xs: list[np.ndarray],
    k: int,
    seed: int,
    rounds: int = 20,
    lam: float = DEFAULT_LAMBDA,
    landmarks: int = 0,
    mass: float = DEFAULT_MASS,
    z0: np.ndarray | None = None,
    callback=None,
) -> dict:
    """Run FedSC on the client blocks ``xs`` without any transport.

    Same functions as the Flower strategy (noise-free). ``callback(round, Z,
    [C_p])`` is called after each round (e.g. to track the reconstruction
    error). Returns ``sigma``, ``d``, ``z``, ``c`` (``d x n``, clients in
    order), ``objective`` per round and ``labels``.
    """
    sums, pairs = zip(*(local_distance_sum(x) for x in xs))
    sigma = combine_bandwidth(sums, pairs)
    if z0 is not None:
        z = np.asarray(z0, dtype=np.float64)
    else:
        d = landmarks or combine_landmark_counts(local_landmark_count(x, sigma, mass) for x in xs)
        z = init_landmarks(d, xs[0].shape[1], seed)
    history = []
    cs = []
    for r in range(1, rounds + 1):
        out = [client_round(x, z, sigma, lam) for x in xs]
        cs = [o[0] for o in out]
        history.append(float(sum(o[2] for o in out)))
        if callback is not None:
            callback(r, z, cs)
        z = average(o[1] for o in out)
    cs = [solve_coefficients(x, z, sigma, lam) for x in xs]
    c = np.hstack(cs)
    labels = cluster_affinity(reconstruct(z, c, sigma), k, seed)
    return {"sigma": sigma, "d": len(z), "z": z, "c": c, "objective": history, "labels": labels}
