"""A lesson defines in its own cells what it teaches; where a script, a benchmark or a loader
worker started by "spawn" needs the same definition importable, the package holds a copy.
The two must not drift apart: a learner reads one and the course runs the other. Where two
lessons each teach a rule the other also uses (lesson 13's and 14's calculators), the two
definitions must be the same too: the learner meets one rule, not two.
"""
from __future__ import annotations

import ast
import inspect

import pytest

from fourcard_helpers import gpt, loaders, moe, reporting, ring, schedules
from helpers import NOTEBOOKS, cells, source

COPIES = [  # (lesson, name, the package's object)
    ("00_cards_and_launching", "exit_without_teardown", reporting.exit_without_teardown),  # every script's last line
    ("04_data_loading", "BatchIndexSampler", loaders.BatchIndexSampler),
    ("04_data_loading", "seed_worker", loaders.seed_worker),
    ("07_model_and_pipeline_parallel", "pipeline_order", schedules.pipeline_order),  # the ranks' scripts import it
    ("07_model_and_pipeline_parallel", "simulate_pipeline", schedules.simulate_pipeline),  # tests check its bubble
    ("07_model_and_pipeline_parallel", "idle_fraction", schedules.idle_fraction),
    *[("13_gpt_on_four_cards", name, getattr(gpt, name))  # the four-rank scripts import the model and its batches
      for name in ("get_batch", "GPTConfig", "Attention", "MLP", "Block", "GPT", "Checkpointed")],
    *[("14_long_sequences_and_experts", name, getattr(ring, name))  # the ring scripts import the rules, layouts, rings
      for name in ("attend", "merge", "chunk_positions", "pass_round", "causal_pairs", "ring_forward", "RingShift",
                   "ring_attention", "LeanRingAttention")],
    *[("14_long_sequences_and_experts", name, getattr(moe, name))  # the expert-parallel scripts import the layer
      for name in ("within_capacity", "MoE", "expert_parallel")],
]


def notebook_definition(lesson: str, name: str) -> str:
    """The source of the top-level `def` or `class` called `name` in the lesson's code cells."""
    path = next(p for p in NOTEBOOKS if p.stem == lesson)
    found = []
    for cell in cells(path):
        text = source(cell)
        if cell["cell_type"] != "code" or text.startswith("%"):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])  # @dataclass too
                found.append("\n".join(text.splitlines()[first - 1:node.end_lineno]))
    assert len(found) == 1, f"{lesson} should define {name} in exactly one cell, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("lesson, name, package_object", COPIES, ids=lambda v: v if isinstance(v, str) else "")
def test_the_package_copy_equals_the_lessons_definition(lesson: str, name: str, package_object: object) -> None:
    assert notebook_definition(lesson, name) == inspect.getsource(package_object).rstrip("\n"), (
        f"{name} in fourcard_helpers differs from the one {lesson} teaches: copy the notebook's cell into the package"
    )


LESSON_PAIRS = [  # (lesson, lesson, name): a rule two lessons each define and must keep the same
    ("13_gpt_on_four_cards", "14_long_sequences_and_experts", "fsdp_pieces"),  # FSDP's whole pieces, both calculators
    ("13_gpt_on_four_cards", "14_long_sequences_and_experts", "llama_parameters"),  # the models both calculators size
]


@pytest.mark.parametrize("first, second, name", LESSON_PAIRS, ids=lambda v: v)
def test_two_lessons_define_the_rule_alike(first: str, second: str, name: str) -> None:
    ours, theirs = notebook_definition(first, name), notebook_definition(second, name)
    assert ours.startswith(f"def {name}(") and ours == theirs, (
        f"{name} in {second} differs from the one {first} teaches: copy {first}'s cell into {second}"
    )


def statements(function: ast.FunctionDef) -> list[str]:
    """What a function does: its body's statements, without its docstring, annotations or comments."""
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return [ast.dump(node) for node in body]


def test_the_training_templates_own_ending_does_what_the_lesson_teaches() -> None:
    """scripts/train_any.py runs outside the course too, where it cannot import the package: its fallback
    exit_without_teardown must do what lesson 00's does, statement for statement."""
    template = ast.parse((NOTEBOOKS[0].parent / "scripts" / "train_any.py").read_text(encoding="utf-8"))
    (fallback,) = [node for node in ast.walk(template) if isinstance(node, ast.FunctionDef) and node.name == "exit_without_teardown"]
    (taught,) = ast.parse(notebook_definition("00_cards_and_launching", "exit_without_teardown")).body
    assert statements(fallback) == statements(taught)
    assert statements(fallback) != statements(ast.parse("def f():\n    os._exit(0)\n").body[0])  # a flush left out is caught
