"""What goes over the wire in ``fedspectral`` and ``fedspectral-plus``: the steps' action names,
what a valid reply holds, and the typed views of the methods' run-config keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from app.config import ConfigView
from app.wire import ArraySpec, ReplySpec

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


@dataclass(frozen=True)
class FedSpectralConfig(ConfigView):
    """The ``fedspectral.*`` keys (declared in :class:`strategies.fedspectral.FedSpectral`)."""

    prefix: ClassVar[str] = "fedspectral"
    n_init: int


@dataclass(frozen=True)
class FedSpectralPlusConfig(ConfigView):
    """The ``fedspectral-plus.*`` keys (declared in :class:`strategies.fedspectral.FedSpectralPlus`)."""

    prefix: ClassVar[str] = "fedspectral-plus"
    mode: str
    iters: int
    rounds: int
    block: int
    solver: str
    basis_blocks: int
    degree: int
    tol: float
    secure: bool
    noise_multiplier: float
    delta: float
    wire_dtype: str
    n_init: int
