"""Lesson 14's expert parallel in real launches on gloo: top-2 with a capacity per rank and the balancing loss from
all-reduced counts equals one card applying that capacity, on two ranks and on a 2 x 2 mesh, and the comparison tells
apart the mistakes it exists to catch (the layer itself: tests/unit/test_moe.py)."""
from __future__ import annotations

import pytest
import torch

from fourcard_helpers.moe import MoE
from helpers import ROOT


# Expert parallel as production runs it (lesson 14's last launch, on two ranks): top-2, a capacity each rank applies
# to its own tokens, the balancing loss from all-reduced counts. The lesson finds it equal to one card applying each
# rank's capacity to that rank's tokens; the same comparison must find the two mistakes it exists to catch.
TOP2_SCRIPT = ROOT / "notebooks" / "scripts" / "14_expert_parallel_top2.py"
OWN_COUNTS = ("dist.all_reduce(counts)  ", "pass  # no all-reduce: each rank's f from its own counts  ")
BATCH_CAPACITY = ("capacity_factor=FACTOR)", "capacity_factor=FACTOR * world)")   # the batch's C on each rank's tokens


# float64's rounding, as the lesson allows it: the same sums in another order move a result by a few units in the last
# place of its largest entry; the mistakes move it by 10⁻⁴ of it and more
ROUNDING = 256 * torch.finfo(torch.float64).eps


def one_card_gaps(reports: dict[int, dict], ranks: int) -> dict[str, float]:
    """The largest differences between the ranks' reports and one card applying each rank's capacity to its tokens
    (the script's layer, batch and loss), each as a share of one card's largest |entry| of that quantity."""
    tokens, width, n_experts = 256, 64, 8
    torch.manual_seed(0)
    layer = MoE(width, n_experts, top_k=2, capacity_factor=1.0).double()
    x, target = torch.randn(2, ranks * tokens, width, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x.requires_grad_()
    out = torch.cat([layer(part) for part in x.split(tokens)])
    layer(x)                                                       # the whole batch's balancing loss
    ((out * target).sum() / len(x) + 0.01 * layer.aux_loss).backward()
    def gap(reported, expected) -> float:
        expected = torch.as_tensor(expected, dtype=torch.float64).detach()
        difference = (torch.as_tensor(reported, dtype=torch.float64) - expected).abs().max().item()
        return difference / max(expected.abs().max().item(), torch.finfo(torch.float64).tiny)
    ranked = [reports[r] for r in range(ranks)]
    return {"output": gap(sum((r["out"] for r in ranked), []), out),
            "balancing loss": max(gap(r["balance"], layer.aux_loss) for r in ranked),
            "router gradient": max(gap(g, p.grad) for r in ranked
                                   for g, p in zip(r["router_grad"], layer.router.parameters())),
            "expert gradients": max(gap(g, p.grad) for r in ranked for e, grads in r["expert_grads"].items()
                                    for g, p in zip(grads, layer.experts[int(e)].parameters()))}


def variants_in_one_launch(text: str, variants: dict[str, tuple[str, str] | None]) -> str:
    """One script that runs the lesson's script once per variant (a mistake written into its text) in one launch,
    each in a fresh namespace, and reports {variant: what the script reports}: one launch's start-up for all."""
    one_group = [("dist.init_process_group(cards.backend)", "pass"), ("dist.destroy_process_group()", "pass"),
                 ("exit_without_teardown()", "pass"), ("report(", "found[VARIANT] = dict(")]
    bodies = {}
    for name, change in variants.items():
        body = text
        for old, new in one_group + ([change] if change else []):
            assert old in body, old
            body = body.replace(old, new)
        bodies[name] = body
    return "\n".join([
        "import os", "import torch.distributed as dist", "from fourcard_helpers import detect, exit_without_teardown, report",
        "dist.init_process_group(detect(int(os.environ['WORLD_SIZE'])).backend)", f"found, BODIES = {{}}, {bodies!r}",
        "for name, body in BODIES.items():",
        "    exec(compile(body, name, 'exec'), {'found': found, 'VARIANT': name})",
        "report(**found)", "dist.destroy_process_group()", "exit_without_teardown()", ""])


@pytest.mark.slow
def test_top2_expert_parallel_equals_one_card_and_tells_the_mistakes_apart() -> None:
    from fourcard_helpers.launch import leftover_processes, torchrun

    script = variants_in_one_launch(TOP2_SCRIPT.read_text(encoding="utf-8"),
                                    {"right": None, "own counts": OWN_COUNTS, "batch capacity": BATCH_CAPACITY})
    reports = torchrun(script, nproc=2, timeout=180, echo=False).reports
    gaps = {name: one_card_gaps({r: reports[r][name] for r in range(2)}, 2)
            for name in ("right", "own counts", "batch capacity")}
    assert max(gaps["right"].values()) <= ROUNDING, gaps["right"]
    own = gaps["own counts"]          # the experts' work is right; the balancing loss and the router's gradient not
    assert own["output"] <= ROUNDING and own["expert gradients"] <= ROUNDING
    assert own["balancing loss"] > 1e6 * ROUNDING and own["router gradient"] > 1e6 * ROUNDING, own
    assert gaps["batch capacity"]["output"] > 1e6 * ROUNDING, gaps["batch capacity"]   # keeps what each rank drops
    assert leftover_processes() == []


MESH_SCRIPT = TOP2_SCRIPT.with_name("14_expert_mesh_2x2.py")
NOT_OVER_DATA = ('dist.all_reduce(p.grad, group=mesh.get_group("data"))', "pass  # each copy keeps its own part")


@pytest.mark.slow
def test_experts_on_a_2x2_mesh_equal_one_card_only_with_their_gradients_added_over_data() -> None:
    from fourcard_helpers.launch import leftover_processes, torchrun

    script = variants_in_one_launch(MESH_SCRIPT.read_text(encoding="utf-8"),
                                    {"right": None, "not over data": NOT_OVER_DATA})
    reports = torchrun(script, nproc=4, timeout=180, echo=False).reports
    gaps = {name: one_card_gaps({r: reports[r][name] for r in range(4)}, 4) for name in ("right", "not over data")}
    assert max(gaps["right"].values()) <= ROUNDING, gaps["right"]
    alone = gaps["not over data"]     # each copy of an expert has only its group's tokens' part of the gradient
    assert alone["output"] <= ROUNDING and alone["router gradient"] <= ROUNDING, alone
    assert alone["expert gradients"] > 1e6 * ROUNDING, alone
    assert leftover_processes() == []
