"""A wrapper that keeps any torch optimizer's weights, gradients and moments in given number formats.

``LowPrecisionOptimizer(torch.optim.Adam(model.parameters()), weight="e5m2", second_moment=...)`` runs the
wrapped optimizer's own update and then rounds, in place:

- ``grad``: each parameter's gradient, before the update uses it;
- ``momentum``: the first-moment buffers (SGD's ``momentum_buffer``, the Adam family's ``exp_avg``);
- ``second_moment``: the second-moment / squared-gradient buffers (``exp_avg_sq``, ``max_exp_avg_sq``,
  RMSprop's ``square_avg``, Adagrad's ``sum``, Adadelta's ``acc_delta``, Adamax's ``exp_inf``);
- ``weight``: the parameters themselves, after every update (and once when wrapped, so training starts on
  the format's grid). There is no float master copy: an update smaller than half a step is lost under
  nearest rounding, and kept in expectation under stochastic rounding (``stochastic=True``, or a format
  whose ``rounding`` is "stochastic").

Each format is a FormatSpec, a format name, or a ``{"name": ..., parameter: value}`` dict. ``seed`` seeds
the stochastic draws (one generator per device, fresh draws every step); without it torch's global
generator is used. State tensors of integer dtype (Adam's ``step`` counter) are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from lowbit.errors import ConfigError, LowbitError
from lowbit.formats import FormatSpec, resolve
from lowbit.nn.gradients import GradientStream

# which optimizer state entries each state role rounds
MOMENT_STATES: dict[str, tuple[str, ...]] = {
    "momentum": ("momentum_buffer", "exp_avg"),
    "second_moment": ("exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf"),
}


def as_format(value: Any, role: str, stochastic: bool = False) -> FormatSpec | None:
    """A FormatSpec from a spec, a name or a ``{"name": ...}`` dict (None stays None)."""
    if value is None:
        return None
    try:
        if isinstance(value, FormatSpec):
            spec = value
        elif isinstance(value, str):
            spec = resolve(value)
        elif isinstance(value, Mapping):
            params = dict(value)
            if "name" not in params:
                raise ConfigError(f"optimizer {role} format needs a 'name' key, got {sorted(params)}")
            spec = resolve(params.pop("name"), **params)
        else:
            raise ConfigError(f"optimizer {role} format must be a format spec, name or dict, got {value!r}")
        return spec.replace(rounding="stochastic") if stochastic else spec
    except ConfigError:
        raise
    except LowbitError as error:
        raise ConfigError(f"optimizer {role} format: {error}") from None


class LowPrecisionOptimizer(torch.optim.Optimizer):
    """``optimizer``'s update with its weights / gradients / moments rounded to formats (module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, weight: Any = None, grad: Any = None,
                 momentum: Any = None, second_moment: Any = None, stochastic: bool = False,
                 seed: int | None = None) -> None:  # fmt: skip
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"LowPrecisionOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        stream = GradientStream(seed)  # checks the seed; one seeded generator per device
        super().__init__(optimizer.param_groups, optimizer.defaults)  # sets up torch's hook bookkeeping
        self.optimizer = optimizer
        self.param_groups, self.state = optimizer.param_groups, optimizer.state  # one copy, shared
        self.formats = {role: as_format(value, role, stochastic) for role, value in
                        (("weight", weight), ("grad", grad), ("momentum", momentum), ("second_moment", second_moment))}  # fmt: skip
        self.seed, self._stream = seed, stream
        self._generators = stream._generators  # device -> generator (train/ saves and restores their states)
        with torch.no_grad():
            self._round_parameters("weight", lambda p: p)

    def __repr__(self) -> str:
        active = ", ".join(f"{role}={spec.describe()}" for role, spec in self.formats.items() if spec is not None)
        return f"LowPrecisionOptimizer({type(self.optimizer).__name__}, {active or 'float'})"

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):  # type: ignore[override]
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            closure = None
        else:
            loss = None
        self._round_parameters("grad", lambda p: p.grad)
        self.optimizer.step()
        for role, names in MOMENT_STATES.items():
            if self.formats[role] is not None:
                for parameter in self._parameters():
                    state = self.optimizer.state.get(parameter, {})
                    for name in names:
                        if isinstance(state.get(name), torch.Tensor) and state[name].is_floating_point():
                            self._round_in_place(role, state[name])
        self._round_parameters("weight", lambda p: p)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "optimizer"):  # torch's own __init__ calls this before the wrapper is set up
            self.optimizer.add_param_group(param_group)

    # ---- rounding ------------------------------------------------------------------------------------
    def _parameters(self):
        for group in self.param_groups:
            yield from group["params"]

    def _round_parameters(self, role: str, pick: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        if self.formats[role] is None:
            return
        for parameter in self._parameters():
            tensor = pick(parameter)
            if tensor is not None and tensor.is_floating_point():
                self._round_in_place(role, tensor)

    def _round_in_place(self, role: str, tensor: torch.Tensor) -> None:
        spec = self.formats[role]
        tensor.copy_(spec.quantize(tensor, self._generator(tensor.device) if spec.is_stochastic else None))

    def _generator(self, device: torch.device) -> torch.Generator | None:
        return self._stream.generator(device)
