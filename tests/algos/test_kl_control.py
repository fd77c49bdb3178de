import pytest

from thinkrl.algos.kl_control import KLController


def test_fixed_controller_keeps_beta():
    ctrl = KLController(value=0.05)
    ctrl.update(current_kl=3.0, n_sequences=100)
    assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
    # kl 0.15 vs target 0.1: error = 0.15/0.1 - 1 = 0.5, clipped to 0.2;
    # beta = 0.1 * (1 + 0.2 * 100 / 1000) = 0.1 * 1.02 = 0.102
    ctrl = KLController(value=0.1, adaptive=True, target_kl=0.1, horizon=1000)
    ctrl.update(current_kl=0.15, n_sequences=100)
    assert ctrl.value == pytest.approx(0.102)
    # kl 0.09: error = -0.1; beta = 0.102 * (1 - 0.1 * 100 / 1000) = 0.102 * 0.99 = 0.10098
    ctrl.update(current_kl=0.09, n_sequences=100)
    assert ctrl.value == pytest.approx(0.10098)


def test_state_round_trip():
    ctrl = KLController(value=0.3, adaptive=True)
    other = KLController(value=0.0, adaptive=True)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.3
