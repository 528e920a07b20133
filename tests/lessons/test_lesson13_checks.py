"""Lessons 13's and 13b's checks must judge what they claim: 13b's Exercise 1 accepts every correct top-k sampler,
however it draws, and rejects the wrong ones; 13's checks of a parallel run's gradient and of the measured bytes fail
on the bugs they exist to catch. The lessons' own cells, executed here (no launch)."""
from __future__ import annotations

import math

import pytest
import torch

from fourcard_helpers import check
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens
from helpers import NOTEBOOKS, code_cell, definitions

LESSON = next(p for p in NOTEBOOKS if p.stem == "13_gpt_on_four_cards")
POET_LESSON = next(p for p in NOTEBOOKS if p.stem == "13b_training_the_poet")


@pytest.fixture(scope="module")
def check_top_k():
    _, chars = poem_tokens()
    poet = GPT(GPTConfig(vocab_size=len(chars))).double()
    poet.load_state_dict(torch.load(POET_LESSON.parent / "measured" / "13_poet" / "model.pt", weights_only=True))
    ns = {"math": math, "torch": torch, "check": check, "chars": chars, "poet_model": poet.eval()}
    exec(definitions(code_cell(POET_LESSON, "def check_top_k(")), ns)  # noqa: S102 - the check itself
    return ns["check_top_k"]


def _reference():
    namespace = {"torch": torch}
    exec(definitions(code_cell(POET_LESSON, "%%solution\ndef top_k_next(").split("\n", 1)[1]), namespace)  # noqa: S102
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


def scores_not_softmax(logits, k, generator):  # multinomial weighs by the scores themselves
    values, places = logits.topk(k)
    return places[torch.multinomial(values, 1, generator=generator)]


def temperature(t):
    def scaled(logits, k, generator):  # the scores divided by a temperature a tenth off 1
        return reference(logits / t, k, generator)
    scaled.__name__ = f"temperature_{t}"
    return scaled


# each wrong sampler, and the words of the check's verdict that name its mistake
WRONG = {k_plus_one: "draw only among the k highest", from_all: "draw only among the k highest",
         not_renormalised: "not sum to 1", uniform: "equally often", greedy: "greedy decoding",
         place_among_k: "its place among the k", scores_not_softmax: "not their softmax",
         temperature(0.9): "a temperature below 1", temperature(1.1): "a temperature above 1"}


@pytest.mark.parametrize("sampler", CORRECT, ids=lambda f: f.__name__)
def test_every_correct_sampler_passes(check_top_k, sampler) -> None:
    check_top_k(sampler)


@pytest.mark.parametrize("sampler", WRONG, ids=lambda f: f.__name__)
def test_every_wrong_sampler_fails_and_is_named(check_top_k, sampler) -> None:
    with pytest.raises(check.CheckFailed, match=WRONG[sampler]):
        check_top_k(sampler)


def _function_and_constants(marker: str, function: str, constants_marker: str) -> str:
    """The named function's definition from the cell holding `marker`, and the `ULPS, FACTOR = ...` line before it."""
    import ast

    text = code_cell(LESSON, marker)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function)
    constants = next(line for line in code_cell(LESSON, constants_marker).splitlines() if line.startswith("ULPS, FACTOR ="))
    return constants + "\n" + ast.get_source_segment(text, node) + "\n"


def _gradients(dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Lesson 13's first step on one card: the whole batch's gradient, and each quarter's (every parameter in one
    vector)."""
    tokens, chars = poem_tokens()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(chars))).to(dtype)
    x, y = get_batch(tokens, 32, 64, torch.Generator().manual_seed(0))
    vectors = []
    for inputs, targets in [(x, y), *zip(x.chunk(4), y.chunk(4))]:
        model.zero_grad()
        model(inputs, targets)[1].backward()
        vectors.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return vectors[0], vectors[1:]


def test_the_gradient_check_passes_an_average_and_fails_a_sum() -> None:
    """Section 3's check of a parallel run's first gradient: the quarters averaged (DDP's sum, in another order than
    the control's) pass; the quarters summed fail, in float64 and in float32 alike, each on its own."""
    whole, quarters = {}, {}
    for name in ("float64", "float32"):
        whole[name], quarters[name] = _gradients(getattr(torch, name))
    add = lambda name, order, divide: sum(quarters[name][q] / divide for q in order).double()
    ns = {"torch": torch, "first_gradient": {name: g.double() for name, g in whole.items()},
          "gradient_control": (add("float32", (3, 2, 1, 0), 4) - whole["float32"].double()).abs().max().item()}
    exec(_function_and_constants("def assert_one_card_gradient(", "assert_one_card_gradient", "def train_one_card("),  # noqa: S102
         ns)
    check_gradient = ns["assert_one_card_gradient"]
    averaged = {name: add(name, (0, 1, 2, 3), 4) for name in whole}
    check_gradient(averaged, "averaged")
    for name in whole:
        with pytest.raises(AssertionError, match=name):
            check_gradient({**averaged, name: add(name, (0, 1, 2, 3), 1)}, "summed")


def _one_card_step(extra_kept: bool = False) -> dict[str, int]:
    """Section 6's measurement for one card, in this process: the shipped script's step (the model at the launch's
    size, a batch of 4 windows, the first step, which makes AdamW's moments) under LiveTensorBytes. `extra_kept`: every block also keeps
    a tensor of its output's size for backward (a bug the check must see)."""
    from fourcard_helpers.memory import LiveTensorBytes

    tokens, chars = poem_tokens()
    config = GPTConfig(vocab_size=len(chars), n_layer=6, d_model=256)
    with LiveTensorBytes() as live:
        live.track([tokens])
        torch.manual_seed(0)
        model = GPT(config)
        if extra_kept:   # a multiplication by ones keeps the ones for backward: d numbers a token, every block
            for block in model.layers:
                block.register_forward_hook(lambda module, inputs, out: out * torch.ones_like(out))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        x, y = get_batch(tokens, 4, config.block_size, torch.Generator().manual_seed(0))
        before = live.peak = live.current
        loss = model(x, y)[1]
        forward = live.current
        loss.backward()
        backward, live.peak = live.peak, live.current
        optimizer.step()
        optimizer.zero_grad()
        del loss
        return {"before": before, "forward": forward, "backward": backward, "optimizer": live.peak,
                "rest": live.current}


@pytest.fixture(scope="module")
def memory_check():
    tokens, chars = poem_tokens()
    ns = {"math": math, "torch": torch, "GPT": GPT, "GPTConfig": GPTConfig, "V": len(chars), "tokens": tokens}
    exec(code_cell(LESSON, "def float32_step("), ns)  # noqa: S102 - the calculator and its check, as the lesson defines them
    return ns


def test_the_memory_check_passes_a_true_measurement_and_fails_a_kept_activation_or_a_calculator_without_logits(
        memory_check) -> None:
    """Section 6's check of the measured bytes, on one card measured here: the lesson's account passes it (before the
    step, what forward keeps, the peak and the bytes at rest, to the byte); a model whose blocks keep one more
    activation fails it, and so does a calculator that leaves out the log-softmax over the vocabulary, or the loss's
    gradients in backward."""
    check_step, calculator = memory_check["check_step"], memory_check["float32_step"]
    measured = _one_card_step()
    check_step("one card", measured)
    with pytest.raises(AssertionError, match="forward kept"):
        check_step("one card", _one_card_step(extra_kept=True))
    n, vocabulary = 4 * 64, memory_check["Vw"]
    without_log_softmax = lambda s, w: {**calculator(s, w), "kept": calculator(s, w)["kept"] - 4 * vocabulary * n}
    with pytest.raises(AssertionError, match="forward kept"):
        check_step("one card", measured, without_log_softmax)
    without_loss_gradients = lambda s, w: {**calculator(s, w), "loss": 0}
    with pytest.raises(AssertionError, match="backward added"):
        check_step("one card", measured, without_loss_gradients)


# Each rank's bytes in the sharded branches of the lesson's launch (notebooks/scripts/13_gpt_memory.py, 4 gloo ranks,
# torch 2.13, counted by LiveTensorBytes: exact, the same on every CPU), as the check receives them.
LAUNCH = {
    "FSDP2 + checkpointing": [
        {"before": 9528856, "forward": 16772384, "backward": 38818336, "optimizer": 30404892, "rest": 21672728},
        {"before": 9528856, "forward": 16772384, "backward": 38818336, "optimizer": 30404892, "rest": 21672728},
        {"before": 9528856, "forward": 16772384, "backward": 38818336, "optimizer": 30404892, "rest": 21672728},
        {"before": 9528856, "forward": 16772384, "backward": 38818336, "optimizer": 30400796, "rest": 21670680}],
    "2 × 2 mesh": [
        {"before": 9551912, "forward": 20898864, "backward": 31956016, "optimizer": 30497068, "rest": 21741864},
        {"before": 9551912, "forward": 20898352, "backward": 31952944, "optimizer": 30497068, "rest": 21741864},
        {"before": 9551912, "forward": 20898864, "backward": 31956016, "optimizer": 30497068, "rest": 21741864},
        {"before": 9551912, "forward": 20898352, "backward": 31952944, "optimizer": 30492972, "rest": 21739816}]}


def test_the_sharded_accounts_equal_the_launch_on_every_rank(memory_check) -> None:
    """The account of each sharded rank (its padded shards, the root FSDP2 keeps gathered, the last block's
    reduce-scatter input, the tied table's gradients, ...) equals the launch's bytes at every moment, and the shards
    of the layout add up to the model: each parameter once over FSDP2's ranks, the ones tp leaves whole twice."""
    ns = memory_check
    for strategy, ranks in LAUNCH.items():
        for rank, measured in enumerate(ranks):
            a = ns["check_step"](strategy, measured, rank=rank)
            assert measured["backward"] == sum(a["before"].values()) + sum(a["peak"].values())   # no allowance used
    whole = sum(v[0] for r in range(4) for v in ns["layout"]("FSDP2 + checkpointing", r).values())
    unsplit = sum(math.prod(shape) for name, shape in ns["SHAPES_WIDE"].items() if name.split(".")[-2] not in ns["TP_CUT"])
    assert whole == ns["P_wide"]
    assert sum(v[0] for r in range(4) for v in ns["layout"]("2 × 2 mesh", r).values()) == ns["P_wide"] + unsplit


@pytest.mark.parametrize("strategy", list(LAUNCH))
def test_a_sharded_branch_keeping_one_more_activation_fails(memory_check, strategy) -> None:
    """A sharded branch whose blocks keep one more activation each (the rank's tokens, d wide, split by tp), or one
    block alone that does, fails the check on what forward kept; one kept through the peak fails it there too."""
    ns = memory_check
    one = 4 * ns["WINDOWS"][strategy] * ns["Tw"] * ns["dw"] // ns["TP"].get(strategy, 1)
    for rank, measured in enumerate(LAUNCH[strategy]):
        for more in (one, ns["Lw"] * one):
            with pytest.raises(AssertionError, match="forward kept"):
                ns["check_step"](strategy, {**measured, "forward": measured["forward"] + more}, rank=rank)
        with pytest.raises(AssertionError, match="peak"):
            ns["check_step"](strategy, {**measured, "backward": measured["backward"] + one}, rank=rank)


@pytest.mark.parametrize("strategy", list(LAUNCH))
def test_a_sharded_branch_holding_unsharded_copies_too_many_fails(memory_check, strategy) -> None:
    """An unsharded copy too many fails the check where it is held: a block FSDP2 did not reshard after forward
    (forward), the root's table gathered twice (forward), a whole copy of a block's weights left at rest (at rest);
    at the peak, where one block-sized tensor more is what timing may leave (which tensor is not identified, so one
    block left gathered there passes), two such copies, or one and an activation."""
    ns = memory_check
    for rank, measured in enumerate(LAUNCH[strategy]):
        parts = ns["layout"](strategy, rank)
        block = 4 * sum(v[2] for name, v in parts.items() if name.startswith("layers.0."))
        table = 4 * parts["tok_embeddings.weight"][2]
        one = 4 * ns["WINDOWS"][strategy] * ns["Tw"] * ns["dw"] // ns["TP"].get(strategy, 1)
        ns["check_step"](strategy, {**measured, "backward": measured["backward"] + block}, rank=rank)   # one rank: allowed
        for moment, extra, message in (("forward", block, "forward kept"), ("forward", table, "forward kept"),
                                       ("backward", 2 * block, "peak"), ("backward", block + one, "peak"),
                                       ("rest", block, "at rest")):
            with pytest.raises(AssertionError, match=message):
                ns["check_step"](strategy, {**measured, moment: measured[moment] + extra}, rank=rank)


@pytest.mark.parametrize("strategy", list(LAUNCH))
def test_a_block_above_the_account_on_every_rank_fails(memory_check, strategy) -> None:
    """The peak's allowance is one block on some ranks: an account that lacks its last block's reduce-scatter input
    (or a block every rank left unsharded) puts all four ranks a block above it, which check_peaks_above fails."""
    ns = memory_check
    blocks = [4 * sum(v[2] for name, v in ns["layout"](strategy, r).items() if name.startswith("layers.0."))
              for r in range(4)]
    ns["check_peaks_above"](strategy, [0, blocks[1], 0, 0])
    with pytest.raises(AssertionError, match="a term it lacks"):
        ns["check_peaks_above"](strategy, blocks)
