"""The DDP doctor, on real launches of scripts written here: each classic mistake is named,
and correct DDP, FSDP, pipeline and tensor-parallel scripts get no warning at all."""
from __future__ import annotations

import textwrap

import pytest

from fourcard_helpers.launch import leftover_processes, torchrun
from fourcard_helpers.rundir import RUN_DIR_ENV

PRELUDE = """
import os, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(250, 8, generator=generator), torch.randint(0, 3, (250,), generator=generator))
"""
DDP_START = PRELUDE + """
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())  # different starting weights: DDP's broadcast must fix them
model = DDP(nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
TRAIN = """
for epoch in range(2):
    {set_epoch}
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
"""


def launch(body: str, nproc: int = 2):
    result = torchrun(textwrap.dedent(body), nproc=nproc, timeout=300, echo=False)
    assert leftover_processes() == []
    return result.warnings


@pytest.mark.slow
def test_the_seed_articles_case_study_unchanged_is_caught() -> None:
    warnings = launch(PRELUDE + """
model = nn.Linear(8, 3)  # no process group, no DDP: the article's script, run on four cards
loader = DataLoader(data, batch_size=64, shuffle=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
""" + TRAIN.format(set_epoch=""), nproc=4)
    assert len(warnings) == 1 and warnings[0].startswith("ranks ended with different weights: max |Δ| ")
    assert "across 4 ranks" in warnings[0] and "never wrapped in DistributedDataParallel" in warnings[0]


def test_a_group_joined_but_a_model_never_wrapped_is_caught() -> None:
    warnings = launch(PRELUDE + """
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = nn.Linear(8, 3)
loader = DataLoader(data, batch_size=50, sampler=DistributedSampler(data))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""" + TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + "dist.destroy_process_group()\n")
    assert len(warnings) == 1 and "joined a process group but ran no collective" in warnings[0]


def test_ranks_that_never_talk_are_caught_even_with_equal_weights() -> None:
    warnings = launch(PRELUDE + """
dist.init_process_group("gloo")
torch.manual_seed(0)  # same start, same data: equal weights by luck, yet no gradient was ever averaged
model = nn.Linear(8, 3)
loader = DataLoader(data, batch_size=50)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""" + TRAIN.format(set_epoch="") + "dist.destroy_process_group()\n")
    assert len(warnings) == 1 and warnings[0].startswith("the ranks joined a process group but ran no collective")


@pytest.mark.slow
def test_a_correct_ddp_script_gets_no_warning() -> None:
    warnings = launch(DDP_START + """
loader = DataLoader(data, batch_size=50, sampler=DistributedSampler(data, drop_last=True))
""" + TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + """
for run in range(3):  # a sweep: a fresh sampler per run, each iterated once (freed ids get reused)
    fresh = DistributedSampler(data)
    fresh.set_epoch(0)
    list(fresh)
    del fresh
test = DataLoader(data, batch_size=50, sampler=DistributedSampler(data, shuffle=False))  # pads 250 to 252, counts combined
with torch.no_grad():
    right = sum((model(x).argmax(1) == y).sum() for x, y in test)
dist.all_reduce(right)
if dist.get_rank() == 0:
    torch.save(model.module.state_dict(), os.environ["OUT"])
dist.barrier()
dist.destroy_process_group()
""".replace('os.environ["OUT"]', f'os.path.join(os.environ["{RUN_DIR_ENV}"], "model.pt")'), nproc=4)
    assert warnings == []


def test_a_sampler_without_set_epoch_is_caught() -> None:
    warnings = launch(DDP_START + "loader = DataLoader(data, batch_size=25, sampler=DistributedSampler(data))\n"
                      + TRAIN.format(set_epoch="") + "dist.destroy_process_group()\n")
    assert len(warnings) == 1 and "iterated 2 times, every time with epoch 0" in warnings[0]
    assert "set_epoch" in warnings[0]


def test_every_rank_saving_the_same_checkpoint_is_caught() -> None:
    warnings = launch(DDP_START + f"""
torch.save(model.module.state_dict(), os.path.join(os.environ["{RUN_DIR_ENV}"], "checkpoint.pt"))
dist.barrier()
dist.destroy_process_group()
""")
    assert len(warnings) == 1 and warnings[0].startswith("ranks [0, 1] all wrote checkpoint.pt with torch.save")


@pytest.mark.slow
def test_an_uncombined_evaluation_on_a_padded_sampler_is_caught() -> None:
    warnings = launch(DDP_START + """
test = DataLoader(data, batch_size=50, sampler=DistributedSampler(data, shuffle=False))
with torch.no_grad():
    right = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
print(f"accuracy {right / len(test.sampler):.3f}")  # this rank's share only, padding included
dist.destroy_process_group()
""", nproc=3)  # 250 samples on 3 ranks: padded to 252
    assert len(warnings) == 1 and "pads 250 samples with 2 repeats" in warnings[0]


@pytest.mark.slow
def test_every_rank_training_on_the_same_batches_is_caught() -> None:
    warnings = launch(DDP_START + """
torch.manual_seed(1)  # the same shuffle on every rank, and no DistributedSampler
loader = DataLoader(data, batch_size=50, shuffle=True)
""" + TRAIN.format(set_epoch="") + "dist.destroy_process_group()\n")
    assert len(warnings) == 1 and warnings[0].startswith("all 2 ranks trained on the same first batch")


@pytest.mark.slow
def test_fsdp_pipeline_and_tensor_parallel_scripts_get_no_warning() -> None:
    fsdp = PRELUDE + """
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data, batch_size=50, sampler=DistributedSampler(data, drop_last=True))
""" + TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + "dist.destroy_process_group()\n"
    pipeline = PRELUDE + """
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
stage = nn.Linear(8, 8)  # two stages of the same shape: different weights, rightly
optimizer = torch.optim.SGD(stage.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    if rank == 0:
        x = torch.randn(4, 8)
        out = stage(x)
        dist.send(out.detach(), 1)
        grad = torch.empty_like(out)
        dist.recv(grad, 1)
        out.backward(grad)
    else:
        x = torch.empty(4, 8)
        dist.recv(x, 0)
        x.requires_grad_()
        stage(x).pow(2).mean().backward()
        dist.send(x.grad, 0)
    optimizer.step()
dist.destroy_process_group()
"""
    tensor_parallel = PRELUDE + """
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
shard = nn.Linear(8, 4, bias=False)  # each rank: half of the output features, same shape
optimizer = torch.optim.SGD(shard.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=50):
    optimizer.zero_grad()
    parts = [torch.empty(50, 4) for _ in range(2)]
    dist.all_gather(parts, shard(x).detach())
    shard(x).pow(2).mean().backward()
    optimizer.step()
dist.destroy_process_group()
"""
    for script in (fsdp, pipeline, tensor_parallel):
        assert launch(script) == [], script[-300:]


@pytest.mark.slow
def test_the_doctor_can_be_switched_off() -> None:
    body = PRELUDE + "model = nn.Linear(8, 3)\nloader = DataLoader(data, batch_size=64, shuffle=True)\n" \
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + TRAIN.format(set_epoch="")
    result = torchrun(body, nproc=2, timeout=300, echo=False, doctor=False)
    assert result.warnings == []
