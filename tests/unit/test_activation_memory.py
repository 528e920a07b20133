"""Lessons 02, 03 and 07 count the case-study model's activation memory the same way.

Each lesson defines `saved_activation_bytes` in its own cells (the idea lives where it is taught):
02 plans memory per card with it, 03 estimates DataParallel's cards with it, 07 sizes pipeline
stages with it. A learner comparing their figures must find one number of bytes per digit, so
here every lesson's definition runs on `MnistCNN` and must give the count derived by hand from the
model's layers, each saved tensor once.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from fourcard_helpers import MnistCNN
from helpers import NOTEBOOKS, cells, source

LESSONS = [path for path in NOTEBOOKS if path.name[:2] in {"02", "03", "07"}]


def function_node(path: Path, name: str = "saved_activation_bytes") -> ast.FunctionDef:
    """The notebook's `def name(...)`, parsed (cell magics left out)."""
    for cell in cells(path):
        text = source(cell)
        if cell["cell_type"] == "code" and f"def {name}(" in text:
            tree = ast.parse("\n".join(line for line in text.splitlines() if not line.startswith("%")))
            return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    raise AssertionError(f"{path.name} defines no {name}()")


def definition(path: Path, name: str = "saved_activation_bytes"):
    """The function `name` as the notebook defines it, compiled on its own."""
    namespace = {"torch": torch}
    exec(compile(ast.Module([function_node(path, name)], []), str(path), "exec"), namespace)  # noqa: S102
    return namespace[name]


def by_hand(batch: int) -> int:
    """Bytes autograd must keep for MnistCNN's backward, tensor by tensor (float32 = 4 B, int64 = 8 B)."""
    per_digit = (4 * 1 * 28 * 28        # conv1's input
                 + 4 * 10 * 24 * 24     # relu(conv1): saved by relu AND by the max-pool: counted once
                 + 8 * 10 * 12 * 12     # the max-pool's indices
                 + 4 * 10 * 12 * 12     # conv2's input
                 + 4 * 20 * 8 * 8       # relu(conv2), again shared by relu and max-pool
                 + 8 * 20 * 4 * 4       # the max-pool's indices
                 + 4 * 320              # fc1's input (the flattened pool output)
                 + 4 * 50)              # relu(fc1), saved by relu and by fc2
    return batch * per_digit


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_counts_each_saved_tensor_once(path: Path) -> None:
    count = definition(path)
    torch.manual_seed(0)
    model = MnistCNN()
    for batch in (8, 16):
        measured, _ = count(model, torch.randn(batch, 1, 28, 28))
        assert measured == by_hand(batch), f"{path.name}: {measured} bytes for {batch} digits, expected {by_hand(batch)}"


def test_the_lessons_share_one_definition() -> None:
    texts = {path.name: ast.unparse(function_node(path)) for path in LESSONS}
    assert len(set(texts.values())) == 1, f"the lessons' definitions differ: {sorted(texts)}"
