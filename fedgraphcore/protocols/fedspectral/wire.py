"""What goes over the wire in ``fedspectral`` and ``fedspectral-plus``: the steps' action names,
what a valid reply holds, and the typed views of the methods' run-config keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedgraphcore.clustering import REGULARISE
from fedgraphcore.config import ConfigView, setting
from fedgraphcore.wire import ArraySpec, ReplySpec

FEDSPECTRAL_LOCAL = "fedspectral_local"
FEDSPECTRAL_POWER = "fedspectral_power"
FEDSPECTRAL_DEGREES = "fedspectral_degrees"
FEDSPECTRAL_PRODUCT = "fedspectral_product"

#: A reply that only acknowledges (the final ``labels``).
RECEIVED_REPLY = ReplySpec(values=("received",))


def local_reply(n: int, k: int) -> ReplySpec:
    """``fedspectral_local``: the client's label in ``0..k-1`` of each of the ``n`` nodes."""
    return ReplySpec(arrays={"labels": ArraySpec((n,), kind="iu", low=0, high=k)})


def upload_reply(name: str, shape: tuple[int, ...], masked: bool, noised: bool) -> ReplySpec:
    """Array ``name`` of ``shape``: masked integers when ``masked`` (``degrees``, n; ``block``, n x b)."""
    return ReplySpec(arrays={name: ArraySpec(shape, kind="u" if masked else "f", masked=masked, noised=noised)})


# -- choices of the run-config keys --------------------------------------------------------
WIRE_DTYPES = ("float64", "float32")
MODES = ("paper", "exact")
SOLVERS = ("auto", "krylov", "chebyshev")


@dataclass(frozen=True)
class FedSpectralConfig(ConfigView):
    """The ``fedspectral.*`` keys of :class:`strategies.fedspectral.FedSpectral` and its client, declared here."""

    prefix: ClassVar[str] = "fedspectral"
    n_init: int = setting(0, "k-means restarts (clients and server; 0: auto, one per 50 rows x clusters until "
                          "1e7 of them per Lloyd sweep, within [10, 1000])", low=0, high=1000)
    regularise: str = setting("auto", "regularised spectral clustering of each client's graph (tau/N added to "
                              "every entry of A, tau to every degree): on, off, or auto (on where that graph has "
                              "more connected components with an edge than clusters)", choices=REGULARISE,
                              primary=True)
    tau: float = setting(0.0, "regularisation tau (0: each graph's average degree)", low=0.0)


@dataclass(frozen=True)
class FedSpectralPlusConfig(ConfigView):
    """The ``fedspectral-plus.*`` keys of :class:`strategies.fedspectral.FedSpectralPlus` and its client,
    declared here."""

    prefix: ClassVar[str] = "fedspectral-plus"
    mode: str = setting("exact", "exact: global operator via secure degree sum, block Krylov (or Chebyshev) "
                        "iteration until converged, the centralised labels (needs every client each round); paper: "
                        "average of local power iterations + QR (Algorithms 3-4), far from centralised when a client "
                        "holds few edges", choices=MODES, primary=True)
    iters: int = setting(0, "paper mode: power iterations per client per round (0: paper's value, email-eu-core 1, "
                         "else 6)", low=0, high=10_000)
    rounds: int = setting(0, "rounds (0: paper mode as the paper, email-eu-core 1, else 20; exact mode at most "
                          "2000); the shared num-rounds key is not used", low=0, high=1_000_000, primary=True)
    block: int = setting(0, "exact mode: block width b >= k (0: 2k, capped at N)", low=0, high=100_000)
    solver: str = setting("auto", "exact mode: krylov (block Lanczos, Rayleigh-Ritz on all blocks so far: about a "
                          "third of chebyshev's rounds), chebyshev (Chebyshev-filtered orthogonal iteration on one "
                          "block: closer to centralised under DP noise), auto: chebyshev when "
                          "fedspectral-plus.noise-multiplier > 0, else krylov", choices=SOLVERS)
    basis_blocks: int = setting(20, "exact mode, krylov: blocks the server keeps before a thick restart (memory: N x "
                                "b x this floats)", low=2, high=10_000)
    degree: int = setting(8, "exact mode, chebyshev: filter degree (1: plain shifted iteration)", low=1, high=1000)
    tol: float = setting(1e-9, "exact mode: stop when every top-k Ritz pair has residual ||M u - theta u|| <= tol "
                         "(krylov; ARPACK's criterion in the centralised reference, tol 1e-9) or the top-k subspace "
                         "moves less than tol, the sine of its largest angle (chebyshev)", low=0.0, high=1.0)
    secure: bool = setting(False, "secure aggregation of every uploaded block")
    noise_multiplier: float = setting(0.0, "Gaussian noise std / edge sensitivity on every upload (0: no noise); "
                                      "edge-level DP", low=0.0, high=1e6)
    delta: float = setting(1e-5, "delta of the edge-level (epsilon, delta)-DP guarantee", low=1e-12, high=0.5)
    wire_dtype: str = setting("float64", "dtype of plain blocks on the wire (both directions)", choices=WIRE_DTYPES)
    n_init: int = setting(0, "k-means restarts on the final embedding, the centralised reference's too (0: auto, "
                          "one per 50 rows x clusters until 1e7 of them per Lloyd sweep, within [10, 1000])",
                          low=0, high=1000)
    regularise: str = setting("auto", "regularised spectral clustering (tau/N added to every entry of A, tau to "
                              "every degree): on, off, or auto (on where the graph has more connected components "
                              "with an edge than clusters; exact mode finds out from the (k+1)-th eigenvalue and "
                              "solves again regularised; paper mode decides on each client's own graph, off under "
                              "noise)", choices=REGULARISE, primary=True)
    tau: float = setting(0.0, "regularisation tau (0: the average degree; paper mode: each client's, and set > 0 "
                         "under noise)", low=0.0)
