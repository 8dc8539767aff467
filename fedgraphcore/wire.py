"""What goes over the wire, as specifications a reply is checked against, without the transport.

A method's protocol module declares its steps' replies with these (:class:`ReplySpec`
of :class:`ArraySpec` and :class:`ValueSpec`); :mod:`fedgraphcore.transport` decodes a
message and checks it (:func:`fedgraphcore.transport.reply_problem`) before a strategy sees
it. :class:`ProtocolError` stops a run whose protocol cannot continue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from fedgraphcore.errors import FedGraphError

#: Protocol steps every method's client answers (:class:`clients.base.ClusteringClient`).
HELLO = "hello"
LABELS = "labels"
SECAGG_SETUP = "secagg_setup"
SECAGG_AGREE = "secagg_agree"
#: A hello request value: the secure-aggregation session id; the client answers with its X25519
#: public key (``public_key``) in the hello reply, saving the ``secagg_setup`` round.
SECAGG_SESSION = "secagg_session"
#: Prefix of the request values that relay every party's public key (``secagg_peer.<party>``) with
#: the first step after key exchange, saving the ``secagg_agree`` round.
SECAGG_PEER = "secagg_peer."
#: A secure sum that survives dropouts (:mod:`fedgraphcore.privacy.secagg_recovery`): its request values
#: name the sum's parties and the threshold their self-mask seeds are shared with; each masked reply
#: also carries its sealed shares (``secagg_shares``, one 60-byte row per party); the extra round
#: ``secagg_unmask`` hands each survivor the shares sealed for it (``secagg_inbox``).
SECAGG_THRESHOLD = "secagg_threshold"
SECAGG_PARTICIPANTS = "secagg_participants"
SECAGG_SHARES = "secagg_shares"
SECAGG_UNMASK = "secagg_unmask"
SECAGG_INBOX = "secagg_inbox"
#: A member's endorsement of the key it advertises (:mod:`fedgraphcore.privacy.roster`): a value of its hello
#: or ``secagg_setup`` reply (empty bytes from a node without an identity key), relayed with the keys
#: as ``secagg_endorsed.<party>``.
KEY_ENDORSEMENT = "key_endorsement"
SECAGG_ENDORSED = "secagg_endorsed."
#: The consistency round before ``secagg_unmask`` (members with identity keys): each survivor signs
#: the survivor set it is told (``survivor_signature``); the unmask request relays every survivor's
#: signature as ``secagg_signed.<party>``.
SECAGG_CONSISTENCY = "secagg_consistency"
SURVIVOR_SIGNATURE = "survivor_signature"
SECAGG_SIGNED = "secagg_signed."


class ProtocolError(FedGraphError, RuntimeError):
    """A protocol step cannot continue (e.g. too few valid replies)."""


@dataclass(frozen=True)
class ArraySpec:
    """Expected array: shape (``None`` = any size on that axis) and dtype kind.

    ``kind`` is a numpy dtype-kind string of accepted kinds, e.g. ``"f"`` for
    floats, ``"iu"`` for integers. Floating arrays must be finite unless
    ``finite`` is False. ``low`` / ``high`` bound the entries (``low <= x <
    high``; e.g. node ids, labels of k clusters), ``unique`` forbids repeats
    (ids). ``masked`` / ``noised`` say whether the client uploads it under
    secure aggregation / with added noise (for the ledger).
    """

    shape: tuple[int | None, ...] | None = None
    kind: str = "f"
    finite: bool = True
    low: float | None = None
    high: float | None = None
    unique: bool = False
    masked: bool = False
    noised: bool = False

    def check(self, name: str, array: np.ndarray) -> str | None:
        """Return why ``array`` does not match, or None."""
        if array.dtype.kind not in self.kind:
            return f"array '{name}' has dtype {array.dtype}, expected kind '{self.kind}'"
        if self.shape is not None:
            ok = array.ndim == len(self.shape) and all(
                want is None or want == got for want, got in zip(self.shape, array.shape)
            )
            if not ok:
                return f"array '{name}' has shape {tuple(array.shape)}, expected {self.shape}"
        if self.finite and array.dtype.kind in "fc" and not np.isfinite(array).all():
            return f"array '{name}' contains NaN or Inf"
        if array.size and (self.low is not None or self.high is not None):
            lo, hi = array.min(), array.max()
            if (self.low is not None and lo < self.low) or (self.high is not None and hi >= self.high):
                return (f"array '{name}' has values in [{lo}, {hi}], expected "
                        f"{self._range()}")
        repeats = array.size - np.unique(array).size if self.unique else 0
        if repeats:
            return f"array '{name}' repeats entries ({repeats} duplicates)"
        return None

    def _range(self) -> str:
        low = "-inf" if self.low is None else self.low
        return f"[{low}, {self.high})" if self.high is not None else f">= {low}"


def whole_number(raw) -> int | None:
    """``raw`` as an int if it is a whole number (an int, or a float without a
    fraction), else None: bools, strings, fractions, NaN and inf are not."""
    if isinstance(raw, (bool, np.bool_)):
        return None
    if isinstance(raw, (int, np.integer)):
        return int(raw)
    return int(raw) if isinstance(raw, (float, np.floating)) and np.isfinite(raw) and raw.is_integer() else None


@dataclass(frozen=True)
class ValueSpec:
    """Expected number in a reply's values: finite (a whole number if ``whole``),
    ``low <= x <= high``; with ``length``, a list of exactly that many such numbers."""

    whole: bool = False
    low: float | None = None
    high: float | None = None
    length: int | None = None

    def check(self, name: str, value) -> str | None:
        """Return why ``value`` does not match, or None."""
        if self.length is not None:
            if not isinstance(value, list) or len(value) != self.length:
                return f"value '{name}' is {value!r}, expected a list of {self.length} numbers"
            items = value
        else:
            items = [value]
        for v in items:
            number = not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))
            if not number or not np.isfinite(v) or (self.whole and whole_number(v) is None):
                return f"value '{name}' is {value!r}, expected {'whole' if self.whole else 'finite'} numbers"
            if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
                return f"value '{name}' is {value!r}, expected numbers {self._range()}"
        return None

    def _range(self) -> str:
        if self.high is None:
            return f">= {self.low}"
        return f"<= {self.high}" if self.low is None else f"in [{self.low}, {self.high}]"


@dataclass(frozen=True)
class ReplySpec:
    """What a valid reply must contain: named arrays and named values, and nothing else.

    ``same_length``: names of arrays that describe the same items (e.g. node
    ids and their labels), whose first axes must agree. ``optional``: values
    a reply may carry or leave out, checked when present. Any other array or
    value is refused: it would be recorded as an upload, and code that walks
    every array (FedAvg) would average it in.
    """

    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    values: Sequence[str] = ()
    same_length: Sequence[str] = ()
    numbers: Mapping[str, ValueSpec] = field(default_factory=dict)
    optional: Mapping[str, ValueSpec] = field(default_factory=dict)

    def problem(self, declared: Mapping[str, tuple[tuple[int, ...], str]], arrays: Mapping[str, np.ndarray],
                values: Mapping) -> str | None:
        """Why a decoded reply (its arrays' ``declared`` shape and dtype, read from the message
        before decoding, the decoded ``arrays`` and ``values``) does not match, or None;
        :func:`fedgraphcore.transport.reply_problem` decodes a message."""
        extra = sorted(set(declared) - set(self.arrays))
        if extra:
            return f"unexpected array '{extra[0]}'"
        reason = _first_problem(self.arrays, arrays, "array")
        if reason:
            return reason
        lengths = {name: arrays[name].shape[0] if arrays[name].ndim else 1
                   for name in self.same_length if name in arrays}
        if len(set(lengths.values())) > 1:
            return "arrays of the same items differ in length: " + ", ".join(
                f"'{name}' {size}" for name, size in lengths.items())
        for name in self.values:
            if name not in values:
                return f"missing value '{name}'"
            value = values[name]
            items = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not np.isfinite(v) for v in items):
                return f"value '{name}' is {value}"
        reason = _first_problem({**self.numbers, **{n: v for n, v in self.optional.items() if n in values}},
                                values, "value")
        extra = sorted(set(values) - set(self.values) - set(self.numbers) - set(self.optional))
        return reason or (f"unexpected value '{extra[0]}'" if extra else None)


def _first_problem(specs: Mapping, found: Mapping, what: str) -> str | None:
    """Why the first of ``specs`` (name -> ArraySpec / ValueSpec) is missing from ``found``
    or does not match, or None."""
    for name, spec in specs.items():
        if name not in found:
            return f"missing {what} '{name}'"
        reason = spec.check(name, found[name])
        if reason:
            return reason
    return None
