"""The errors of secure aggregation: one line each, raised instead of a wrong or leaking result."""

from common.errors import FedloraError


class SecAggError(FedloraError):
    """Bad protocol parameters, or a stage that must refuse (too few survivors, too few shares)."""


class ShareAuthError(SecAggError):
    """An encrypted share failed authentication or is bound to another round, sender or receiver."""
