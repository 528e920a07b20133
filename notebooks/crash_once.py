"""A small model and MNIST data for scripts/train_any.py, and the same data with a crash:
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


class KillOnce(Dataset):
    """`data`, except that rank 1 dies when it fetches its `at`-th item. SIGKILL cannot be caught:
    no except clause, no atexit handler runs, as when the out-of-memory killer strikes.
    torchrun numbers its attempts in TORCHELASTIC_RESTART_COUNT (0 first): only attempt 0 dies."""

    def __init__(self, data, at):
        self.data, self.at, self.fetched = data, at, 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        self.fetched += 1
        if self.fetched == self.at and os.environ.get("RANK") == "1" \
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            print(f"rank 1: killed at item {self.at} it fetched (SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.data[index]


def kill_point(train_size, world):
    """The item rank 1 dies at: train_any looks at item 0 once, then each epoch every rank fetches
    train_size // world items (DistributedSampler); half of the second epoch after that."""
    per_epoch = train_size // world
    return 1 + per_epoch + per_epoch // 2


def build_datasets_cut_once():
    train, test = build_datasets()
    return KillOnce(train, at=kill_point(len(train), int(os.environ["WORLD_SIZE"]))), test
