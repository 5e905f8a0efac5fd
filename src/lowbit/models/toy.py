"""ToyNet, the toy model of seed 002 / MASE: flatten -> Linear(in, hidden) -> ReLU -> Linear(hidden, hidden)
-> ReLU -> Linear(hidden, classes) inside ``seq_blocks``, so its fx nodes are ``x, size, view,
seq_blocks_0 ... seq_blocks_4, output`` as in MASE (hidden = 100, the 2023 width seed 002 uses)."""

from __future__ import annotations

import math

import torch
from torch import nn


class ToyNet(nn.Module):
    def __init__(self, image_size: tuple[int, ...] = (1, 2, 2), num_classes: int = 2, hidden: int = 100) -> None:
        super().__init__()
        features = math.prod(image_size)
        self.seq_blocks = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq_blocks(x.view(x.size(0), -1))
