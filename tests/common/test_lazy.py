"""A package's lazy re-exports (common/lazy.py): a name loads its module when first read."""

import json
import subprocess
import sys

import pytest

import common.models


def test_a_name_loads_its_module_on_first_read_only():
    """Reading MODELS loads the registry, not the loader (transformers, PEFT: ~10 s on 2 cores)."""
    probe = (
        "import json, sys\nimport common.models\nwatch = ('common.models.registry', 'common.models.loader')\n"
        "before = [m in sys.modules for m in watch]\nfrom common.models import MODELS\n"
        "print(json.dumps([before, [m in sys.modules for m in watch], 'minilm-l6' in MODELS]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [[False, False], [True, False], True]


def test_a_read_name_is_the_module_s_own_object_and_is_listed():
    from common.models import lora

    assert common.models.lora_layers is lora.lora_layers
    assert {"load_model", "lora_layers", "MODELS"} <= set(dir(common.models))
    assert set(common.models.__all__) <= set(dir(common.models))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        common.models.nope  # noqa: B018
