"""The build exercises of lessons 05 and 09 (fourcard_helpers/exercises): the reference solution passes,
and each mistake a learner makes is named from what the ranks saw, in real torchrun launches on gloo (two
ranks: the diagnoses are the same as on four). The parts that need no launch, the skeleton told "not
attempted" and the solution cells' match with the package included, are in tests/unit/test_exercises_in_process.py."""
from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from fourcard_helpers import exercises
from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.solutions import ddp, sharding
from helpers import mistake, write

HEADER = "import contextlib\n\nimport torch\nimport torch.distributed as dist\nfrom torch import nn\n\n\n"
OVERLAPPED = HEADER + inspect.getsource(ddp._unused) + "\n\n" + inspect.getsource(ddp.OverlappedDDP)
BUCKETED = HEADER + inspect.getsource(ddp._unused) + "\n\n" + inspect.getsource(ddp.BucketedDDP)
SHARDED = HEADER + inspect.getsource(sharding.ShardedOptimizer)
FSDP = HEADER + inspect.getsource(sharding._Gather) + "\n\n" + inspect.getsource(sharding.HandFSDP)
ANSWER = "answer.py"   # the file the learner's answer is in


def diagnosis(tmp_path: Path, exercise: str, text: str) -> str:
    with pytest.raises(CheckFailed) as failure:
        exercises.run(exercise, write(tmp_path, text, ANSWER), nproc=2)
    return str(failure.value)


@pytest.mark.slow
def test_the_command_line_grades_a_file(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "fourcard_helpers.check"]
    listed = subprocess.run([*command, "--list"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert {line.split("\t")[0] for line in listed} >= {"overlapped-ddp", "bucketed-ddp", "sharded-optimizer",
                                                        "hand-fsdp"}
    skeleton = write(tmp_path, HEADER + "class OverlappedDDP(nn.Module):\n    def __init__(self, module):\n"
                                        "        raise NotImplementedError\n", "skeleton.py")
    graded = {}
    for name, text in (("skeleton", None), ("right", OVERLAPPED),
                       ("summed", mistake(OVERLAPPED, "            param.grad /= dist.get_world_size()\n", ""))):
        path = skeleton if text is None else write(tmp_path, text, f"{name}.py")
        graded[name] = subprocess.run([*command, "overlapped-ddp", str(path), "--nproc", "2"], capture_output=True,
                                      text=True)
    assert graded["skeleton"].returncode == 2 and "not attempted" in graded["skeleton"].stdout
    assert graded["right"].returncode == 0 and "✓ overlapped-ddp: correct" in graded["right"].stdout
    assert graded["summed"].returncode == 1 and "summed over the 2 ranks" in graded["summed"].stdout
    assert subprocess.run([*command, "no-such-exercise", str(skeleton)], capture_output=True).returncode == 2


NO_OVERLAP = mistake(OVERLAPPED, """    def _launch(self, param: torch.Tensor) -> None:
        if self.syncing:
            self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))
""", """    def _launch(self, param: torch.Tensor) -> None:
        if self.syncing and not getattr(self, "queued", False):
            self.queued = True  # every all-reduce from one callback, run once backward has ended
            torch.autograd.Variable._execution_engine.queue_callback(self._launch_all)

    def _launch_all(self) -> None:
        for param in self.module.parameters():
            if param.requires_grad:
                self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))
        self.queued = False
""")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no broadcast", "wait at once", "after backward", "hooked twice", "no overlap",
                                  "buffers broadcast"])
def test_overlapped_ddp_names_the_mistake(tmp_path: Path, case: str) -> None:
    if case == "buffers broadcast":  # DDP's broadcast_buffers=True: a broadcast before forward is no gradient
        synced = mistake(OVERLAPPED, "    def forward(self, *args, **kwargs):\n",
                         "    def forward(self, *args, **kwargs):\n        for b in self.module.buffers():\n"
                         "            dist.broadcast(b, src=0)\n")
        assert "6 all-reduces per step" in exercises.run("overlapped-ddp", write(tmp_path, synced, ANSWER), nproc=2)
        return
    wrong, said = {
        "no broadcast": (mistake(OVERLAPPED, "            dist.broadcast(tensor.data, src=0)", "            pass"),
                         "nothing was broadcast"),
        "wait at once": (mistake(OVERLAPPED, "            self.pending.append((param, dist.all_reduce(param.grad, "
                                             "async_op=True)))",
                                 "            work = dist.all_reduce(param.grad, async_op=True)\n"
                                 "            work.wait()\n            self.pending.append((param, work))"),
                         "waited for right after it was launched"),
        "after backward": (mistake(mistake(OVERLAPPED, "            self.pending.append((param, dist.all_reduce("
                                                       "param.grad, async_op=True)))",
                                           "            self.pending.append((param, None))"),
                                   "            work.wait()", "            dist.all_reduce(param.grad)"),
                           "after backward had ended"),
        "hooked twice": (mistake(OVERLAPPED, "        for param in module.parameters():\n",
                                 "        for param in [p for sub in module.modules() for p in sub.parameters()]:\n"),
                         "a gradient was sent more than once"),
        "no overlap": (NO_OVERLAP, "launched only once backward had produced every gradient"),
    }[case]
    assert said in diagnosis(tmp_path, "overlapped-ddp", wrong)


@pytest.mark.slow
def test_a_rank_that_skips_a_collective_is_named_at_the_time_limit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "COLLECTIVE_TIMEOUT", 3.0)
    skipping = mistake(OVERLAPPED, "        if self.syncing:\n",
                       "        if self.syncing and not (dist.get_rank() == 1 and param.dim() == 1):\n")
    said = diagnosis(tmp_path, "overlapped-ddp", skipping)
    assert "rank(s) [1] never launched collective" in said or "differs between ranks" in said, said
    assert "backward 1" in said


@pytest.mark.slow
def test_bucketed_ddp_passes_and_counts_its_messages(tmp_path: Path) -> None:
    assert "2 all-reduces per step of [195, 84] numbers" in exercises.run("bucketed-ddp", write(tmp_path, BUCKETED, ANSWER),
                                                                         nproc=2)
    per_parameter = mistake(BUCKETED, "            if size >= cap:", "            if size > 0:")
    assert "one all-reduce per parameter" in diagnosis(tmp_path, "bucketed-ddp", per_parameter)


FLAT_ZERO = HEADER + """class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.slices, local_groups = [], []
        for group in self.param_groups:  # each group flat, padded, cut into equal slices (DeepSpeed's stage 1)
            total = sum(p.numel() for p in group["params"])
            per = -(-total // self.world)
            flat = torch.zeros(per * self.world, dtype=group["params"][0].dtype)
            torch.cat([p.detach().reshape(-1) for p in group["params"]], out=flat[:total])
            piece = flat[self.rank * per:(self.rank + 1) * per].clone().requires_grad_(True)
            self.slices.append((piece, total, per))
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [piece]})
        self.inner = {"adam": optimizer_cls(local_groups, **kwargs)}  # kept in a dict: still found

    @torch.no_grad()
    def step(self, closure=None):
        for group, local, (piece, total, per) in zip(self.param_groups, self.inner["adam"].param_groups,
                                                     self.slices):
            local.update({k: v for k, v in group.items() if k != "params"})
            grads = torch.zeros(per * self.world, dtype=piece.dtype)
            grads[:total] = torch.cat([p.grad.reshape(-1) for p in group["params"]])
            piece.grad = grads[self.rank * per:(self.rank + 1) * per].clone()
        self.inner["adam"].step()
        for group, (piece, total, per) in zip(self.param_groups, self.slices):
            flat = torch.empty(per * self.world, dtype=piece.dtype)
            dist.all_gather_into_tensor(flat, piece.detach())
            offset = 0
            for p in group["params"]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["right", "flat slices", "everything", "all on rank 0"])
def test_the_sharded_optimizer_passes_and_weighs_each_ranks_state(tmp_path: Path, case: str) -> None:
    if case in ("right", "flat slices"):  # each parameter's state on one rank; or equal padded slices of groups
        verdict = exercises.run("sharded-optimizer", write(tmp_path, SHARDED if case == "right" else FLAT_ZERO, ANSWER),
                                nproc=2)
        assert ("[288, 270], 558 together (one card: 558)" if case == "right" else
                "[280, 280], 560 together (one card: 558)") in verdict, verdict
        return
    wrong, said = {
        "everything": (mistake(SHARDED, "if self.owner[p] == rank]", "]"), "every rank holds the whole optimizer state"),
        "all on rank 0": (mistake(SHARDED, "            load[self.owner[param]] += param.numel()\n", ""),
                          "rank 0 holds 558 numbers of optimizer state, the ranks [558, 0]"),
    }[case]
    assert said in diagnosis(tmp_path, "sharded-optimizer", wrong)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["right", "storage freed in place", "off by one", "bf16 masters", "gathers kept",
                                  "a copy kept"])
def test_hand_fsdp_passes_and_names_the_mistake(tmp_path: Path, case: str) -> None:
    if case in ("right", "storage freed in place"):  # the second frees as FSDP does: the tensor stays, empty
        freed = mistake(FSDP, "                sub.__dict__.pop(name, None)  # the whole weight is freed; backward "
                              "gathers it again\n",
                        "                weight = sub.__dict__.pop(name)\n                if _sharded:\n"
                        "                    sub.__dict__['_unsharded_' + name] = weight\n"
                        "                    weight.untyped_storage().resize_(0)\n")
        verdict = exercises.run("hand-fsdp", write(tmp_path, FSDP if case == "right" else freed, ANSWER), nproc=2)
        assert "648 bytes" in verdict and "the Linear weights gathered again in backward" in verdict, verdict
        return
    wrong, said = {
        "off by one": (mistake(mistake(FSDP, "per_rank = -(-param.numel() // world)", "per_rank = param.numel() // world"),
                               "flat[:param.numel()] = param.detach().reshape(-1)",
                               "flat[:] = param.detach().reshape(-1)[:flat.numel()]"),
                       "do not divide"),
        "bf16 masters": (mistake(FSDP, "flat[rank * per_rank:(rank + 1) * per_rank].clone()",
                                 "flat[rank * per_rank:(rank + 1) * per_rank].clone().to(compute_dtype or flat.dtype)"),
                         "the masters"),
        "gathers kept": (mistake(FSDP, "        dist.all_gather_into_tensor(flat, shard)\n        return",
                                 "        dist.all_gather_into_tensor(flat, shard)\n"
                                 "        self.__dict__[f'_kept{k}'] = flat\n        return"),
                         "still holds the whole embed.weight, hidden.weight, out.weight"),
        "a copy kept": (mistake(FSDP, "        dist.all_gather_into_tensor(flat, shard)\n        return",
                                "        dist.all_gather_into_tensor(flat, shard)\n"
                                "        self.__dict__.setdefault('_kept', {})[k] = torch.cat([flat, flat])\n"
                                "        return"),
                        "a gathered weight (or a copy of it) was kept"),
    }[case]
    assert said in diagnosis(tmp_path, "hand-fsdp", wrong)
