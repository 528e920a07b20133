"""Lesson 12's data (crash_once.py), each training item handed out 4 ms late: an epoch of about a second on two
ranks, long enough to signal a job in the middle of its training. The numbers are those of the fast data."""
import time

from torch.utils.data import Dataset

from crash_once import build_datasets


class Late(Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        time.sleep(0.004)
        return self.data[index]


def build_datasets_slow():
    train, test = build_datasets()
    return Late(train), test
