"""The course's case study for `scripts/train_any.py`: MnistCNN on the shipped digits, with the
training images shifted by up to two pixels at random (a cheap augmentation: a digit drawn a
little off-centre is still the same digit, and the network sees fewer exact repeats).
`build_datasets_held_out` is for choosing settings without looking at the test digits: it holds
an eighth of the training digits out, as the set train_any.py evaluates on.

    torchrun --nproc-per-node=4 scripts/train_any.py --model mnist_recipe:build_model \\
        --data mnist_recipe:build_datasets --optimizer adamw --lr LR --schedule cosine --epochs 8 --batch-size 16

with LR the learning rate lesson 11 chooses, by accuracy on `build_datasets_held_out`'s second set.
"""
import torch
from torch.utils.data import Dataset, Subset

from fourcard_helpers import load_mnist
from fourcard_helpers.models import MnistCNN
from fourcard_helpers.rundir import MNIST_FULL_ENV, setting

# FOURCARDS_MNIST_FULL=1: the full 60,000/10,000 MNIST, once fourcard_helpers.download_full_mnist() has fetched it
FULL = setting(MNIST_FULL_ENV) == "1"


class Shifted(Dataset):
    """Images rolled by a random (dy, dx) in [-2, 2]; drawn from torch's generator, which
    train_any.py seeds per rank and saves in every checkpoint (so resuming stays exact)."""

    def __init__(self, data: Dataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.data[index]
        dy, dx = torch.randint(-2, 3, (2,)).tolist()
        return torch.roll(image, shifts=(dy, dx), dims=(-2, -1)), label


def build_model() -> MnistCNN:
    return MnistCNN()


def build_datasets() -> tuple[Dataset, Dataset]:
    return Shifted(load_mnist("train", full=FULL)), load_mnist("test", full=FULL)


def build_datasets_held_out() -> tuple[Dataset, Dataset]:
    """(7/8 of the training digits, shifted; the other 1/8, as they are): a validation split, so
    that a setting chosen by its accuracy there owes nothing to the test digits."""
    train = load_mnist("train", full=FULL)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    held_out = len(train) // 8
    return Shifted(Subset(train, order[held_out:])), Subset(train, order[:held_out])
