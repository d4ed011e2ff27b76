"""A package's lazy re-exports (common/lazy.py): a name loads its module when first read."""

import json
import subprocess
import sys

import pytest

import common.models


def test_a_name_loads_its_module_on_first_read_only():
    probe = (
        "import json, sys\nimport common.models\nbefore = 'common.models.loader' in sys.modules\n"
        "from common.models import load_model\n"
        "print(json.dumps([before, 'common.models.loader' in sys.modules, load_model.__module__]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, True, "common.models.loader"]


def test_a_read_name_is_the_module_s_own_object_and_is_listed():
    from common.models import lora

    assert common.models.lora_layers is lora.lora_layers
    assert {"load_model", "lora_layers", "MODELS"} <= set(dir(common.models))
    assert set(common.models.__all__) <= set(dir(common.models))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        common.models.nope  # noqa: B018
