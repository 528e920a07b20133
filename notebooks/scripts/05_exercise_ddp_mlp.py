"""Exercise 4: train this regression MLP on every card torchrun starts, with DDP, as the task above says."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fourcard_helpers import detect, report, exit_without_teardown

generator = torch.Generator().manual_seed(0)  # the data: 512 points, y = sin(sum of x) + noise
x = torch.randn(512, 8, generator=generator)
y = x.sum(1, keepdim=True).sin() + 0.1 * torch.randn(512, 1, generator=generator)
dataset = TensorDataset(x, y)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def main():
    # your code here: process group, DistributedSampler (seed 0, set_epoch), 16 points per card, DDP,
    # 3 epochs of SGD (lr 0.1) on F.mse_loss, then report(weights=model.module.state_dict()) and teardown
    raise NotImplementedError


main()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
