"""Card detection: simulated cards without GPUs, clear errors when GPUs are demanded."""
from __future__ import annotations

import pytest
import torch

from fourcard_helpers.cards import CardsError, detect


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA A100 80GB PCIe")


def test_no_gpu_gives_simulated_cards(no_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FOURCARD_DEVICE", raising=False)
    cards = detect(4)
    assert (cards.kind, cards.count, cards.backend) == ("cpu", 4, "gloo")
    assert cards.device(3) == torch.device("cpu")
    assert cards.describe() == "4 simulated cards (CPU processes, gloo) — no GPU found"


def test_too_few_gpus_fall_back_to_simulated_cards(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FOURCARD_DEVICE", raising=False)
    cards = detect(4)
    assert cards.kind == "cpu"
    assert "only 2 GPUs found for 4 ranks" in cards.describe()


def test_enough_gpus_use_nccl(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FOURCARD_DEVICE", raising=False)
    cards = detect(2)
    assert (cards.kind, cards.backend) == ("cuda", "nccl")
    assert cards.device(1) == torch.device("cuda", 1)
    assert cards.describe() == "2 × NVIDIA A100 80GB PCIe (NCCL)"


def test_forcing_cpu_on_a_gpu_machine(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOURCARD_DEVICE", "cpu")
    cards = detect(2)
    assert cards.kind == "cpu" and cards.describe().endswith("FOURCARD_DEVICE=cpu")


def test_demanding_more_gpus_than_exist_says_what_to_do(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOURCARD_DEVICE", "cuda")
    with pytest.raises(CardsError, match=r"4 ranks asked for but 2 GPUs found.*nproc=2.*FOURCARD_DEVICE=cpu"):
        detect(4)


def test_demanding_gpus_without_any(no_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOURCARD_DEVICE", "cuda")
    with pytest.raises(CardsError, match="no GPU found"):
        detect(4)


def test_unknown_choice_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOURCARD_DEVICE", "gpu")
    with pytest.raises(CardsError, match="auto, cpu, cuda"):
        detect(4)
