"""A small model and MNIST data for scripts/train_any.py, and the same data with a power cut:
rank 1 is killed with SIGKILL in the middle of the second epoch, on the first attempt only."""
import os
import signal

from torch import nn
from torch.utils.data import Dataset, Subset

from fourcard_helpers import load_mnist


def build_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 32), nn.ReLU(), nn.Linear(32, 10))


def build_datasets():
    return Subset(load_mnist("train"), range(512)), Subset(load_mnist("test"), range(128))


class PowerCut(Dataset):
    """`data`, except that rank 1 dies when it fetches its `at`-th item. SIGKILL cannot be caught:
    no except clause, no atexit handler runs, as when the out-of-memory killer strikes or a
    machine loses power. torchrun numbers its attempts in TORCHELASTIC_RESTART_COUNT (0 first)."""

    def __init__(self, data, at):
        self.data, self.at, self.fetched = data, at, 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        self.fetched += 1
        if self.fetched == self.at and os.environ.get("RANK") == "1" \
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            print(f"rank 1: power cut at item {self.at} it fetched (SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.data[index]


def build_datasets_cut_once():
    train, test = build_datasets()
    # item 1: train_any looks at data[0]; then 256 items per epoch on each of 2 ranks: die mid-epoch 2
    return PowerCut(train, at=1 + 256 + 128), test
