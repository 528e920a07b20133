"""Lesson 13's checks must judge what they claim: Exercise 1's accepts every correct top-k sampler, however it
draws, and rejects the wrong ones. The lesson's own cells, executed here (no launch)."""
from __future__ import annotations

import pytest
import torch

from fourcard_helpers import check
from fourcard_helpers.gpt import GPT, GPTConfig, poem_tokens
from test_lesson12_exercise import definitions
from test_notebooks import NOTEBOOKS, cells, source

LESSON = next(p for p in NOTEBOOKS if p.stem == "13_gpt_on_four_cards")


def code_cell(marker: str) -> str:
    found = [source(c) for c in cells(LESSON) if c["cell_type"] == "code" and marker in source(c)]
    assert len(found) == 1, f"expected one code cell of lesson 13 containing {marker!r}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def check_top_k():
    _, chars = poem_tokens()
    poet = GPT(GPTConfig(vocab_size=len(chars))).double()
    poet.load_state_dict(torch.load(LESSON.parent / "measured" / "13_poet" / "model.pt", weights_only=True))
    ns = {"torch": torch, "check": check, "chars": chars, "poet_model": poet.eval()}
    exec(definitions(code_cell("def check_top_k(")), ns)  # noqa: S102 - the check itself
    return ns["check_top_k"]


def _reference():
    namespace = {"torch": torch}
    exec(definitions(code_cell("%%solution\ndef top_k_next(").split("\n", 1)[1]), namespace)  # noqa: S102
    return namespace["top_k_next"]


reference = _reference()  # the lesson's own solution


def nanogpt(logits, k, generator):  # nanoGPT's generate(): mask below the k-th score, softmax over all, one draw
    v, _ = torch.topk(logits, min(k, logits.size(-1)))
    logits[logits < v[[-1]]] = -float("Inf")
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator)


def unsorted(logits, k, generator):
    values, places = logits.topk(k, sorted=False)
    return places[torch.multinomial(torch.softmax(values, 0), 1, generator=generator)]


def inverse_cdf(logits, k, generator):  # another way of drawing: a uniform number against the cumulative sum
    values, places = logits.topk(k)
    cumulative = torch.softmax(values, 0).cumsum(0)
    u = torch.rand(1, generator=generator, dtype=cumulative.dtype) * cumulative[-1]
    return places[torch.searchsorted(cumulative, u).clamp(max=k - 1)]


CORRECT = [reference, nanogpt, unsorted, inverse_cdf]


def k_plus_one(logits, k, generator):
    return reference(logits, k + 1, generator)


def from_all(logits, k, generator):
    return torch.multinomial(torch.softmax(logits, 0), 1, generator=generator)


def not_renormalised(logits, k, generator):  # the k probabilities of the softmax over all, the rest left to the k-th
    probabilities, places = torch.softmax(logits, 0).topk(k)
    u = torch.rand(1, generator=generator, dtype=probabilities.dtype)
    return places[torch.searchsorted(probabilities.cumsum(0), u).clamp(max=k - 1)]


def uniform(logits, k, generator):  # the k candidates, the softmax forgotten
    return logits.topk(k).indices[torch.multinomial(torch.ones(k), 1, generator=generator)]


def greedy(logits, k, generator):
    return logits.topk(1).indices


def place_among_k(logits, k, generator):  # the draw's place among the k, not its number in the vocabulary
    values, _ = logits.topk(k)
    return torch.multinomial(torch.softmax(values, 0), 1, generator=generator)


WRONG = [k_plus_one, from_all, not_renormalised, uniform, greedy, place_among_k]


@pytest.mark.parametrize("sampler", CORRECT, ids=lambda f: f.__name__)
def test_every_correct_sampler_passes(check_top_k, sampler) -> None:
    check_top_k(sampler)


@pytest.mark.parametrize("sampler", WRONG, ids=lambda f: f.__name__)
def test_every_wrong_sampler_fails(check_top_k, sampler) -> None:
    with pytest.raises(check.CheckFailed) as failure:
        check_top_k(sampler)
    print(sampler.__name__, failure.value)
