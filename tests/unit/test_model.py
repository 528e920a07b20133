"""The case-study model is the seed article's network, layer for layer."""
from __future__ import annotations

import torch
from torch import nn

from fourcard_helpers.models import MnistCNN, MnistCNNWithBatchNorm, count_parameters


def test_layers_match_the_seed_article() -> None:
    model = MnistCNN()
    assert [(name, type(module).__name__) for name, module in model.named_children()] == [
        ("conv1", "Conv2d"), ("conv2", "Conv2d"), ("fc1", "Linear"), ("fc2", "Linear")]
    assert (model.conv1.in_channels, model.conv1.out_channels, model.conv1.kernel_size) == (1, 10, (5, 5))
    assert (model.conv2.in_channels, model.conv2.out_channels, model.conv2.kernel_size) == (10, 20, (5, 5))
    assert (model.fc1.in_features, model.fc1.out_features) == (320, 50)
    assert (model.fc2.in_features, model.fc2.out_features) == (50, 10)
    assert count_parameters(model) == 21_840


def test_forward_is_the_seed_forward() -> None:
    torch.manual_seed(0)
    model = MnistCNN()
    x = torch.randn(8, 1, 28, 28)
    h = torch.max_pool2d(torch.relu(model.conv1(x)), 2)
    h = torch.max_pool2d(torch.relu(model.conv2(h)), 2)
    seed = model.fc2(torch.relu(model.fc1(h.view(-1, 320))))
    assert model(x).shape == (8, 10)
    assert torch.equal(model(x), seed)


def test_sequential_view_shares_the_weights() -> None:
    torch.manual_seed(0)
    model = MnistCNN()
    sequential = model.as_sequential()
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(sequential(x), model(x))
    assert {id(p) for p in sequential.parameters()} == {id(p) for p in model.parameters()}


def test_batchnorm_variant() -> None:
    model = MnistCNNWithBatchNorm()
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 2
    assert model(torch.randn(4, 1, 28, 28)).shape == (4, 10)
