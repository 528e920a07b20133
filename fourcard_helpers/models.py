"""The case-study model of the course: the seed article's small MNIST CNN."""
from __future__ import annotations

import torch
from torch import nn


class MnistCNN(nn.Module):
    """Exactly the seed article's network (21,840 parameters).

    Conv2d(1,10,5) → ReLU → MaxPool(2) → Conv2d(10,20,5) → ReLU → MaxPool(2)
    → flatten to 320 → Linear(320,50) → ReLU → Linear(50,10).
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)  # 1×28×28 → 10×12×12
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)  # → 20×4×4 = 320 numbers
        x = torch.relu(self.fc1(x.flatten(1)))  # the seed's x.view(-1, 320)
        return self.fc2(x)

    def as_sequential(self) -> nn.Sequential:
        """The same layers (shared, not copied) as an nn.Sequential, so that a lesson can
        cut the model into stages for model or pipeline parallelism."""
        return nn.Sequential(
            self.conv1, nn.ReLU(), nn.MaxPool2d(2),
            self.conv2, nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), self.fc1, nn.ReLU(), self.fc2,
        )


class MnistCNNWithBatchNorm(nn.Module):
    """The case study with a BatchNorm after each convolution: the model on which
    SyncBatchNorm makes a difference (batch statistics differ between cards)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)
        self.bn1 = nn.BatchNorm2d(10)
        self.bn2 = nn.BatchNorm2d(20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable numbers in `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
