"""Lesson 13b's build exercise, nanoGPT's optimizer and schedule under FSDP2: the reference passes, and each mistake
a learner makes is named from what the ranks saw. One launch of four ranks grades the reference and every mistake
(real torchrun, gloo, FSDP2)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import training_recipe
from fourcard_helpers.solutions import recipe
from helpers import mistake

SOLUTION = inspect.getsource(recipe)
GROUPS = '''    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                                  lr=peak, betas=(0.9, 0.95))'''
RULE = '''    decay = [p for p in model.parameters() if p.dim() >= 2]     # the matrices and the embedding tables
    keep = [p for p in model.parameters() if p.dim() < 2]       # the norms' scales and shifts
'''
SCHEDULER = "    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)"

MISTAKES = {  # name: (the learner's file, what the check must say)
    "one group for all (torchtitan's default)": (
        mistake(SOLUTION, GROUPS, "    optimizer = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), "
                                  "weight_decay=0.1)"), "as torchtitan's default AdamW has"),
    "minGPT's rule": (mistake(SOLUTION, RULE, '''    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embeddings" not in n]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2 or "embeddings" in n]
'''), "That is minGPT's rule"),
    "a norm's bias decayed": (mistake(SOLUTION, RULE, '''    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 or n == "norm.bias"]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2 and n != "norm.bias"]
'''), "decayed, though nanoGPT leaves them alone: norm.bias"),
    "a parameter in no group": (mistake(SOLUTION, '{"params": keep, "weight_decay": 0.0}',
                                        '{"params": keep[1:], "weight_decay": 0.0}'), "in no group of the optimizer"),
    "weight decay 0.01": (mistake(SOLUTION, '"weight_decay": 0.1}', '"weight_decay": 0.01}'),
                          "weight_decay=0.01, where nanoGPT uses 0.1"),
    "AdamW's default betas": (mistake(SOLUTION, "lr=peak, betas=(0.9, 0.95))", "lr=peak)"), "betas are (0.9, 0.999)"),
    "amsgrad": (mistake(SOLUTION, "lr=peak, betas=(0.9, 0.95))", "lr=peak, betas=(0.9, 0.95), amsgrad=True)"),
                "AdamW was given amsgrad=True"),
    "the lesson's peak typed in": (mistake(SOLUTION, "lr=peak, betas", "lr=3e-3, betas"), "give AdamW lr=peak"),
    "the norms' group without weight_decay": (mistake(SOLUTION, '{"params": keep, "weight_decay": 0.0}', '{"params": keep}'),
                                              "has weight_decay=0.01. A group whose dict gives no weight_decay"),
    "the norms' group given AdamW's own weight_decay": (
        mistake(SOLUTION, GROUPS, '''    optimizer = torch.optim.AdamW([{"params": decay}, {"params": keep}], lr=peak, betas=(0.9, 0.95),
                                  weight_decay=0.1)'''), "has weight_decay=0.1. A group whose dict gives no weight_decay"),
    "Adam's L2 weight decay": (mistake(SOLUTION, "torch.optim.AdamW(", "torch.optim.Adam("), "use torch.optim.AdamW"),
    "SGD": (mistake(SOLUTION, GROUPS, '''    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                                lr=peak, momentum=0.9)'''), "configure_optimizer built SGD, an optimizer without Adam's betas"),
    "warm-up from 0": (mistake(SOLUTION, "return (step + 1) / (warmup + 1)", "return step / warmup"),
                       "The first step ran at a rate of 0"),
    "warm-up one step short": (mistake(SOLUTION, "return (step + 1) / (warmup + 1)", "return (step + 1) / warmup"),
                               "The warm-up is off"),
    "cosine down to 0": (mistake(SOLUTION, "return 0.1 + 0.45 * (1 + math.cos(", "return 0.5 * (1 + math.cos("),
                         "The cosine ends at 0"),
    "cosine one step too long": (mistake(SOLUTION, "(steps - 1 - warmup)))", "(steps - warmup)))"),
                                 "The cosine must reach a tenth of the peak at the last step"),
    "a constant factor": (mistake(SOLUTION, SCHEDULER, "    return optimizer, torch.optim.lr_scheduler.LambdaLR("
                                                       "optimizer, lambda step: 1.0)"), "The rate never changed"),
    "the optimizer alone": (mistake(SOLUTION, SCHEDULER, "    return optimizer"),
                            "configure_optimizer returned AdamW: return a pair"),
}


OTHER_CORRECT = {  # other right answers, which must pass too
    "groups by ndim, no-decay group first, a list of two factors": mistake(mistake(mistake(
        SOLUTION, RULE, '''    keep = [p for p in model.parameters() if p.ndim < 2]
    decay = [p for p in model.parameters() if p.ndim >= 2]
'''), '[{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}]',
        '[{"params": keep, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.1}]'),
        "LambdaLR(optimizer, factor)", "LambdaLR(optimizer, [factor, factor])"),
    "Adam with decoupled weight decay": mistake(SOLUTION, "lr=peak, betas=(0.9, 0.95))",
                                               "lr=peak, betas=(0.9, 0.95), decoupled_weight_decay=True)").replace(
        "torch.optim.AdamW(", "torch.optim.Adam("),
}


def test_the_mistakes_are_changes_of_the_reference() -> None:
    assert len({text for text, _ in MISTAKES.values()} | {SOLUTION}) == len(MISTAKES) + 1


@pytest.mark.slow
def test_the_reference_passes_and_each_mistake_is_named(tmp_path: Path) -> None:
    """One launch of four ranks grades the reference, two other right answers and every mistake."""
    paths = []
    for k, text in enumerate([SOLUTION, *OTHER_CORRECT.values()] + [text for text, _ in MISTAKES.values()]):
        paths.append(tmp_path / f"answer{k}.py")
        paths[-1].write_text(text, encoding="utf-8")
    verdict, *outcomes = training_recipe.grade(paths, nproc=4)
    others, failures = outcomes[:len(OTHER_CORRECT)], outcomes[len(OTHER_CORRECT):]
    assert isinstance(verdict, str), verdict
    assert all(isinstance(outcome, str) for outcome in others), dict(zip(OTHER_CORRECT, others))
    assert "4 ranks" in verdict and "weight decay 0.1 on its 14 parameters" in verdict and "10 norm parameters" in verdict
    for (name, (_, said)), failure in zip(MISTAKES.items(), failures):
        assert isinstance(failure, CheckFailed) and said in str(failure), (name, failure)
