"""Privacy machinery: secure aggregation, local DP, Gaussian mechanism, ledger.

Submodules are imported lazily by callers (``from fedgraphcore.privacy.secagg import ...``)
so that importing the ledger does not pull in torch/opacus.
"""

from fedgraphcore.privacy.ledger import PrivacyLedger

__all__ = ["PrivacyLedger"]
