"""Small models for the 8x8 digits dataset: an MLP and a CNN (both fx-traceable)."""

from __future__ import annotations

import torch
from torch import nn


class DigitsMLP(nn.Module):
    """64 -> 128 -> 64 -> 10 with ReLUs."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden // 2)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(hidden // 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


class DigitsCNN(nn.Module):
    """conv 3x3 (16) -> ReLU -> maxpool 2 -> conv 3x3 (32) -> ReLU -> maxpool 2 -> linear 10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))
