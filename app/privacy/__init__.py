"""Privacy machinery: secure aggregation, local DP, Gaussian mechanism, ledger.

Submodules are imported lazily by callers (``from app.privacy.secagg import ...``)
so that importing the ledger does not pull in torch/opacus.
"""

from app.privacy.ledger import PrivacyLedger

__all__ = ["PrivacyLedger"]
