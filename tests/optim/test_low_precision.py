"""LowPrecisionOptimizer: weights / gradients / moments rounded after every step, stochastic rounding keeps
small updates in expectation, seeded runs repeat."""

import pytest
import torch

from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.optim import LowPrecisionOptimizer

GRID = {"name": "integer", "width": 8, "frac_width": 4}  # step 1/16
# squared gradients (1e-5 and below) underflow e4m3 / e5m2: an 8-bit exponent keeps them
WIDE_RANGE = {"name": "minifloat_ieee", "width": 12, "exponent_width": 8}


def _on_grid(tensor, step=1 / 16):
    return torch.equal(tensor / step, torch.round(tensor / step))


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 3)


def _train(optimizer, model, steps=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 5, generator=gen)).pow(2).mean().backward()
        optimizer.step()


def test_adam_weights_and_moments_live_on_their_grids():
    model = _model()
    optimizer = LowPrecisionOptimizer(torch.optim.Adam(model.parameters(), lr=0.05), weight=GRID,
                                      momentum=resolve("e5m2"), second_moment=WIDE_RANGE)  # fmt: skip
    assert _on_grid(model.weight.detach())  # rounded when wrapped
    _train(optimizer, model)
    e5m2, wide = resolve("e5m2"), resolve("minifloat_ieee", width=12, exponent_width=8)
    for parameter in model.parameters():
        state = optimizer.state[parameter]
        assert _on_grid(parameter.detach())
        assert torch.equal(state["exp_avg"], e5m2.quantize(state["exp_avg"]))
        assert torch.equal(state["exp_avg_sq"], wide.quantize(state["exp_avg_sq"]))
        assert state["exp_avg_sq"].ne(0).any()


def test_sgd_momentum_and_gradients_are_rounded():
    model = _model()
    optimizer = LowPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), grad=GRID,
                                      momentum=GRID)  # fmt: skip
    _train(optimizer, model, steps=2)
    for parameter in model.parameters():
        assert _on_grid(parameter.grad) and _on_grid(optimizer.state[parameter]["momentum_buffer"])


def test_nearest_loses_small_updates_stochastic_keeps_them_in_expectation():
    # every update is 0.01, a sixth of the 1/16 step: nearest rounding undoes it each time
    def final_weight(stochastic, seed):
        weight = torch.nn.Parameter(torch.zeros(4000))
        optimizer = LowPrecisionOptimizer(torch.optim.SGD([weight], lr=0.01), weight=GRID, stochastic=stochastic,
                                          seed=seed)  # fmt: skip
        for _ in range(20):
            weight.grad = torch.full_like(weight, -1.0)
            optimizer.step()
        return weight.detach()

    assert torch.equal(final_weight(False, 0), torch.zeros(4000))
    stochastic = final_weight(True, 0)
    # 20 steps of 0.01: mean 0.2; the mean of 4000 weights strays by well under 0.01
    assert abs(stochastic.mean().item() - 0.2) < 0.01
    assert torch.equal(stochastic, final_weight(True, 0))  # seeded: the same draws
    assert not torch.equal(stochastic, final_weight(True, 1))


def test_state_dict_round_trip_and_repr():
    model = _model()
    optimizer = LowPrecisionOptimizer(torch.optim.Adam(model.parameters()), weight=GRID)
    _train(optimizer, model, steps=1)
    saved = optimizer.state_dict()
    other_model = _model()
    other = LowPrecisionOptimizer(torch.optim.Adam(other_model.parameters()), weight=GRID)
    other.load_state_dict(saved)
    assert torch.equal(other.state[other_model.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    assert "Adam" in repr(optimizer) and "integer" in repr(optimizer)


def test_bad_arguments():
    model = _model()
    with pytest.raises(ConfigError, match="weight"):
        LowPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), weight="int9")
    with pytest.raises(ConfigError, match="name"):
        LowPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), momentum={"width": 8})
    with pytest.raises(ConfigError, match="wraps"):
        LowPrecisionOptimizer(model, weight=GRID)
