"""Card detection: simulated cards without GPUs, clear errors when GPUs are demanded."""
from __future__ import annotations

import pytest
import torch

from fourcard_helpers.cards import CardsError, detect
from fourcard_helpers.rundir import DEVICE_ENV, LANG_ENV, RENAMED


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
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(RENAMED[DEVICE_ENV], raising=False)
    cards = detect(4)
    assert (cards.kind, cards.count, cards.backend) == ("cpu", 4, "gloo")
    assert cards.device(3) == torch.device("cpu")
    assert cards.describe() == "4 simulated cards (CPU processes, gloo) — no GPU found"


def test_too_few_gpus_fall_back_to_simulated_cards(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(RENAMED[DEVICE_ENV], raising=False)
    cards = detect(4)
    assert cards.kind == "cpu"
    assert "only 2 GPUs found for 4 ranks" in cards.describe()


def test_enough_gpus_use_nccl(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(RENAMED[DEVICE_ENV], raising=False)
    cards = detect(2)
    assert (cards.kind, cards.backend) == ("cuda", "nccl")
    assert cards.device(1) == torch.device("cuda", 1)
    assert cards.describe() == "2 × NVIDIA A100 80GB PCIe (NCCL)"


def test_forcing_cpu_on_a_gpu_machine(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    cards = detect(2)
    assert cards.kind == "cpu" and cards.describe().endswith("FOURCARDS_DEVICE=cpu")


def test_demanding_more_gpus_than_exist_says_what_to_do(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(CardsError, match=r"4 ranks asked for but 2 GPUs found.*nproc=2.*FOURCARDS_DEVICE=cpu"):
        detect(4)


def test_demanding_gpus_without_any(no_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(CardsError, match="no GPU found"):
        detect(4)


def test_unknown_choice_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "gpu")
    with pytest.raises(CardsError, match="auto, cpu, cuda"):
        detect(4)


def test_the_old_name_still_works_and_says_the_new_one(two_gpus: None, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """FOURCARD_DEVICE, the name before the one prefix, is still read for a while, with one line naming the new
    one (once a process), and what the cards say names the variable the learner set."""
    from fourcard_helpers import rundir

    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setenv(RENAMED[DEVICE_ENV], "cpu")
    monkeypatch.setattr(rundir, "_noticed", set())
    assert detect(2).describe().endswith("FOURCARD_DEVICE=cpu") and detect(2).kind == "cpu"
    assert capsys.readouterr().err == ("fourcards: FOURCARD_DEVICE still works for now, but its name is now "
                                       "FOURCARDS_DEVICE: set FOURCARDS_DEVICE instead.\n")
    monkeypatch.setenv(DEVICE_ENV, "auto")  # the new name wins, silently
    assert detect(2).kind == "cuda" and capsys.readouterr().err == ""


def test_a_titles_few_words_open_the_cards_line_in_either_language(monkeypatch: pytest.MonkeyPatch) -> None:
    """short() is what describe() says before its parenthesis, in English and in Chinese, whose parenthesis is
    full-width (a title that split describe() on " (" kept all of the Chinese line)."""
    from fourcard_helpers.cards import Cards

    simulated, gpus = Cards("cpu", 4, "gloo", reason="no GPU"), Cards("cuda", 4, "nccl", names=("NVIDIA H100",) * 4)
    for language, simulated_words in (("en", "4 simulated cards"), ("zh", "4 张模拟卡")):
        monkeypatch.setenv(LANG_ENV, language)
        opening = simulated_words + ("（" if language == "zh" else " (")
        assert simulated.short() == simulated_words and simulated.describe().startswith(opening)
        assert gpus.short() == "4 × NVIDIA H100" and gpus.describe().startswith("4 × NVIDIA H100 (")
