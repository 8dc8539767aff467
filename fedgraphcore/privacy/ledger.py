"""Privacy ledger: what each mechanism protects and what each client sent.

One :class:`PrivacyLedger` per run.  Strategies register every privacy
mechanism they apply (:meth:`PrivacyLedger.add_mechanism`) and every array a
client uploads (:meth:`PrivacyLedger.add_upload`).  :meth:`PrivacyLedger.to_dict`
produces the JSON-serialisable ``privacy`` section of ``result.json``.

Epsilon is computed at call time of :meth:`to_dict`, from the accountant
attached to each mechanism, so a mechanism may be registered once and applied
many times afterwards (the accountant counts the applications).

Accountant forms accepted by ``add_mechanism(..., accountant=...)``:

* an object with ``epsilon()`` (e.g. :class:`fedgraphcore.privacy.gaussian.GaussianMechanism`,
  :class:`fedgraphcore.privacy.ldp.LDPAccountant`); delta is read from its ``delta``
  attribute if present, else from ``params["delta"]``, else 0;
* an Opacus accountant (has ``get_epsilon(delta)``); delta from ``params["delta"]``;
* a zero-argument callable returning ``epsilon`` or ``(epsilon, delta)``;
* ``None``: if ``params`` carries ``epsilon`` (and optionally ``delta``) and the
  guarantee is a DP guarantee, those values are reported as they are;
  otherwise the mechanism reports ``"none"``.

Overall (epsilon, delta): basic sequential composition (sum) over the
mechanisms with a formal DP guarantee.  This is an upper bound; it is exact
when only one DP mechanism is registered.  Mechanisms whose guarantee is not a
DP guarantee (secure aggregation, heuristic noise) do not contribute; if no
mechanism has a DP guarantee, ``epsilon`` and ``delta`` are ``None``.
``"overall_note"`` says which mechanisms were composed.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

__all__ = ["PrivacyLedger", "GUARANTEE_SECAGG", "GUARANTEE_NONE", "dp_guarantee"]

GUARANTEE_SECAGG = "secure aggregation: server sees only sums"
GUARANTEE_NONE = "none: heuristic noise ratio, no formal guarantee"


def dp_guarantee(kind: str = "(epsilon, delta)-DP") -> str:
    """Return the canonical guarantee string for a DP mechanism."""
    return kind


def _is_dp(guarantee: str) -> bool:
    """True for guarantee strings naming (L)DP, e.g. "(epsilon, delta)-DP", "epsilon-LDP"."""
    g = guarantee.strip().lower()
    if g.startswith("none") or g.startswith("secure"):
        return False
    return re.search(r"(?<![a-z])(l?dp|differential privacy)(?![a-z])", g) is not None


def _jsonable(v: Any) -> Any:
    """Convert numpy scalars/arrays, tuples, inf/nan to JSON-safe values."""
    try:
        import numpy as np
    except Exception:  # pragma: no cover
        np = None
    if np is not None:
        if isinstance(v, np.ndarray):
            return [_jsonable(x) for x in v.tolist()]
        if isinstance(v, np.generic):
            v = v.item()
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    return str(v)


def _client_id(client: Any) -> int | str:
    """Client ids as plain int (numpy integers included) or str."""
    if isinstance(client, bool):
        return str(client)
    try:
        import numbers

        if isinstance(client, numbers.Integral):
            return int(client)
    except Exception:  # pragma: no cover
        pass
    return client if isinstance(client, str) else str(client)


def _float(x: Any) -> float:
    return float(x)


class PrivacyLedger:
    """Per-run record of privacy mechanisms and client uploads (thread-safe)."""

    def __init__(self) -> None:
        self._mechanisms: list[dict[str, Any]] = []
        self._uploads: dict[tuple, dict[str, Any]] = {}
        self._lock = threading.Lock()
        #: step -> what a fully malicious server can learn from a reply of it (the run's strategy)
        self.server_learns: dict[str, str] = {}

    # ------------------------------------------------------------------ mechanisms
    def add_mechanism(
        self,
        name: str,
        protects: str,
        params: dict,
        guarantee: str,
        accountant: Any = None,
    ) -> None:
        """Register a mechanism.

        ``name``: unique label (e.g. ``"gaussian:Z"``); registering the same
        name again replaces the earlier entry (e.g. updated params).
        ``protects``: what is protected (e.g. ``"client factor Z_p per round"``).
        ``params``: JSON-able parameters (clip, noise multiplier, epsilon, m ...).
        ``guarantee``: ``"(epsilon, delta)-DP"``, ``"epsilon-LDP"``,
        :data:`GUARANTEE_SECAGG`, :data:`GUARANTEE_NONE`, ...
        ``accountant``: see module docstring.
        """
        entry = {
            "name": str(name),
            "protects": str(protects),
            "params": dict(params or {}),
            "guarantee": str(guarantee),
            "accountant": accountant,
        }
        with self._lock:
            for i, m in enumerate(self._mechanisms):
                if m["name"] == entry["name"]:
                    self._mechanisms[i] = entry
                    return
            self._mechanisms.append(entry)

    # --------------------------------------------------------------------- uploads
    def add_upload(
        self,
        action: str,
        client: int | str,
        name: str,
        shape: tuple,
        dtype: str,
        masked: bool = False,
        noised: bool = False,
        rejected: bool = False,
    ) -> None:
        """Record that ``client`` sent array ``name`` in phase ``action``
        (``rejected``: in a reply the server refused, which left the client all the same).

        Identical records (same action, client, name, shape, dtype, flags) are
        aggregated into one row with a ``count``.
        """
        shape_t = tuple(int(s) for s in shape)
        key = (str(action), str(_client_id(client)), str(name), shape_t, str(dtype), bool(masked), bool(noised),
               bool(rejected))
        with self._lock:
            row = self._uploads.get(key)
            if row is None:
                self._uploads[key] = {
                    "action": str(action),
                    "client": _client_id(client),
                    "name": str(name),
                    "shape": list(shape_t),
                    "dtype": str(dtype),
                    "masked": bool(masked),
                    "noised": bool(noised),
                    "rejected": bool(rejected),
                    "count": 1,
                }
            else:
                row["count"] += 1

    # ---------------------------------------------------------------- accounting
    @staticmethod
    def _eps_delta(m: dict[str, Any]) -> tuple[float | None, float | None]:
        """(epsilon, delta) of one mechanism, or (None, None) if no formal DP."""
        if not _is_dp(m["guarantee"]):
            return None, None
        acc = m["accountant"]
        params = m["params"]
        pdelta = params.get("delta", 0.0)
        if acc is None:
            if "epsilon" in params:
                return _float(params["epsilon"]), _float(pdelta or 0.0)
            return None, None
        if hasattr(acc, "epsilon") and callable(acc.epsilon):
            eps = _float(acc.epsilon())
            d = getattr(acc, "delta", None)
            if callable(d):
                d = d()
            return eps, _float(d if d is not None else (pdelta or 0.0))
        if hasattr(acc, "get_epsilon"):
            if not pdelta:
                raise ValueError(f"mechanism {m['name']!r}: Opacus accountant needs params['delta'] > 0")
            try:
                if len(acc) == 0:  # Opacus accountants have __len__ = number of steps
                    return 0.0, _float(pdelta)
            except TypeError:
                pass
            return _float(acc.get_epsilon(delta=pdelta)), _float(pdelta)
        if callable(acc):
            r = acc()
            if isinstance(r, tuple):
                return _float(r[0]), _float(r[1])
            return _float(r), _float(pdelta or 0.0)
        raise TypeError(f"mechanism {m['name']!r}: unsupported accountant {type(acc).__name__}")

    def _overall(self):
        with self._lock:
            mechs = list(self._mechanisms)
        rows = []
        eps_tot, delta_tot, composed = 0.0, 0.0, []
        for m in mechs:
            eps, delta = self._eps_delta(m)
            rows.append((m, eps, delta))
            if eps is not None:
                eps_tot += eps
                delta_tot += delta or 0.0
                composed.append(m["name"])
        if not composed:
            return None, None, rows, composed
        return eps_tot, min(delta_tot, 1.0), rows, composed

    def to_dict(self) -> dict:
        """JSON-serialisable ``privacy`` section (epsilon computed now)."""
        eps, delta, rows, composed = self._overall()
        mechanisms = []
        for m, e, d in rows:
            mechanisms.append(
                {
                    "name": m["name"],
                    "protects": m["protects"],
                    "guarantee": m["guarantee"],
                    "params": _jsonable(m["params"]),
                    "epsilon": _jsonable(e) if e is not None else "none",
                    "delta": _jsonable(d) if d is not None else "none",
                }
            )
        with self._lock:
            uploads = [dict(r) for r in self._uploads.values()]
        # secure aggregation is no DP guarantee, but no gap either; "covered by" names the DP mechanism that holds
        heuristic = [m["name"] for m, e, _ in rows
                     if e is None and not m["guarantee"].lower().startswith(("secure", "covered by"))]
        if composed:
            note = "basic composition (sum) over: " + ", ".join(composed)
            if len(composed) > 1:  # the terms may protect different units (a client, a graph, a row)
                note += ("; each term holds for its mechanism's own unit and adjacency ('protects', 'params'), "
                         "so the sum bounds a change that is within one unit of each (e.g. one graph of one client)")
        else:
            note = "no mechanism with a formal DP guarantee"
        if heuristic:
            note += "; not covered by a DP guarantee: " + ", ".join(heuristic)
        steps = {row["action"] for row in uploads}
        return {
            "mechanisms": mechanisms,
            "uploads": _jsonable(uploads),
            "malicious_server": {step: text for step, text in self.server_learns.items() if step in steps},
            "epsilon": _jsonable(eps),
            "delta": _jsonable(delta),
            "overall_note": note,
        }

    def __repr__(self) -> str:  # pragma: no cover
        return f"PrivacyLedger({len(self._mechanisms)} mechanisms, {len(self._uploads)} upload kinds)"
