"""Our accountants plugged in where Flower expects a ``PrivacyAccountant``."""

import pytest
from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant as FlowerRdp

from common.privacy.accountants import RDP_ORDERS
from common.privacy.flower import FlowerAccountant


def _config(method=SamplingMethod.POISSON, max_epsilon=8.0):
    return PrivacyConfig(1e-5, 100, NeighboringRelation.ADD_OR_REMOVE_ONE, method, max_epsilon)


@pytest.mark.parametrize("method", [SamplingMethod.POISSON, SamplingMethod.NO_AMPLIFICATION])
def test_rdp_backend_agrees_with_flowers_rdp_accountant(method):
    ours, theirs = FlowerAccountant(_config(method), "rdp"), FlowerRdp(_config(method), orders=RDP_ORDERS)
    event = GaussianPrivacyEvent(noise_multiplier=1.2, sample_size=10, population_size=100)
    for acc in (ours, theirs):
        acc.compose(event, 40)
    assert ours.num_releases == theirs.num_releases == 40
    # independent RDP codes (ours: Opacus's analysis; Flower: dp_accounting) agree closely
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=2e-3)
    for count in (1, 60, 400):
        assert ours.would_exceed(event, count=count) == theirs.would_exceed(event, count=count)


def test_privacy_spent_state_and_pld_backend():
    acc = FlowerAccountant(_config(), "pld")
    acc.compose(GaussianPrivacyEvent(noise_multiplier=1.0, sample_size=10, population_size=100), 50)
    spent = acc.get_privacy_spent()
    assert spent.delta == 1e-5 and spent.num_releases == 50 and spent.accounting_method == "pld"
    assert spent.epsilon == pytest.approx(5.148, abs=0.011)  # docs/design.md §5 table (PRV est 5.148)
    again = FlowerAccountant(_config(), "pld")
    again.load_state_dict(acc.state_dict())
    assert again.get_epsilon(1e-5) == spent.epsilon


def test_unsupported_model_is_refused():
    cfg = PrivacyConfig(1e-5, 100, NeighboringRelation.REPLACE_ONE, SamplingMethod.WITHOUT_REPLACEMENT)
    with pytest.raises(ValueError, match="unsupported accounting model"):
        FlowerAccountant(cfg, "gdp")
