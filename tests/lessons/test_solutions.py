"""The build exercises' reference solutions against PyTorch's own: DistributedDataParallel,
ZeroRedundancyOptimizer (and one card's Adam, its state dict and a learning-rate scheduler), fully_shard. One real two-rank torchrun launch on gloo trains each pair
from the same weights on the same batches, in float64, and reports the largest difference."""
from __future__ import annotations

import pytest

from fourcard_helpers.launch import torchrun
from helpers import ANOTHER_ROUNDING

SCRIPT = '''
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, exit_without_teardown, report
from fourcard_helpers.solutions import BucketedDDP, HandFSDP, OverlappedDDP, ShardedOptimizer

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))


class Net(nn.Module):  # a layer used twice, a frozen one, uneven sizes (35 = 5 × 7 weights)
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 5)
        self.hidden = nn.Linear(5, 5)
        self.frozen = nn.Linear(5, 7).requires_grad_(False)
        self.norm = nn.LayerNorm(7)
        self.out = nn.Linear(7, 3)

    def forward(self, tokens):
        h = torch.tanh(self.hidden(torch.tanh(self.hidden(self.embed(tokens)))))
        return self.out(self.norm(self.frozen(h)))


def net(dtype=torch.float64):
    torch.manual_seed(0)
    return Net().to(device, dtype)


def batches(steps=3):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens, target = torch.randint(0, 11, (4 * world,), generator=g), torch.randn(4 * world, 3, generator=g)
        yield tokens[rank * 4:(rank + 1) * 4].to(device), target[rank * 4:(rank + 1) * 4].to(device, torch.float64)


def gap(a, b):
    return max((x.detach().double() - y.detach().double()).abs().max().item() for x, y in zip(a, b))


def train(model, optimizer, finish=lambda: None, accumulate=False, steps=3):
    for tokens, target in batches(steps):
        optimizer.zero_grad()
        if accumulate:  # two micro-batches, the first without communication
            with model.no_sync():
                (F.mse_loss(model(tokens[:2]).double(), target[:2]) / 2).backward()
            (F.mse_loss(model(tokens[2:]).double(), target[2:]) / 2).backward()
        else:
            F.mse_loss(model(tokens).double(), target).backward()
        finish()
        optimizer.step()


found = {}
for accumulate in (False, True):
    theirs = DDP(net())
    train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.3), accumulate=accumulate)
    ours = OverlappedDDP(net())
    train(ours, torch.optim.SGD(ours.parameters(), lr=0.3), ours.finish, accumulate=accumulate)
    found[f"overlapped_ddp{'_no_sync' if accumulate else ''}"] = gap(ours.parameters(), theirs.module.parameters())

theirs = DDP(net(), bucket_cap_mb=0.0002)
train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.3))
ours = BucketedDDP(net(), bucket_mb=0.0002)
train(ours, torch.optim.SGD(ours.parameters(), lr=0.3), ours.finish)
found["bucketed_ddp"] = gap(ours.parameters(), theirs.module.parameters())
found["buckets"] = [len(bucket) for bucket in ours.buckets]

groups = lambda model: [{"params": [model.embed.weight, model.out.bias], "lr": 0.01}, {"params": [model.hidden.weight, model.hidden.bias, model.norm.weight, model.norm.bias, model.out.weight]}]
mine, reference = net(), net()
theirs = ZeroRedundancyOptimizer(groups(reference), optimizer_class=torch.optim.Adam, lr=0.05)
ours = ShardedOptimizer(groups(mine), torch.optim.Adam, lr=0.05)
for model, optimizer in ((reference, theirs), (mine, ours)):
    ddp = DDP(model)
    train(ddp, optimizer)
found["sharded_optimizer"] = gap(mine.parameters(), reference.parameters())
found["state_numbers"] = sum(t.numel() for s in ours.local.state.values() for t in s.values() if t.dim())

for dtype in (None, torch.bfloat16):
    theirs = net()
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float64) if dtype else MixedPrecisionPolicy()
    for layer in (theirs.embed, theirs.hidden, theirs.out):
        fully_shard(layer, mp_policy=policy)
    fully_shard(theirs, mp_policy=policy)
    steps = 1 if dtype else 3  # bf16: one step, before the tied layer's difference (below) spreads
    train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.3), steps=steps)
    full_theirs = {name: p.full_tensor() for name, p in theirs.named_parameters()}
    ours = HandFSDP(net(), compute_dtype=dtype)
    train(ours, torch.optim.SGD(ours.parameters(), lr=0.3), ours.finish, steps=steps)
    full_ours = ours.full_parameters()
    key = "hand_fsdp" + ("_bf16" if dtype else "")
    found[key] = {n: gap([full_ours[n]], [full_theirs[n]]) for n in full_theirs}
    found[key + "_names"] = sorted(full_ours) == sorted(full_theirs) or sorted(full_ours)
    found[key + "_masters"] = sorted({str(p.dtype) for p in ours.parameters()})
    found[key + "_shard_numbers"] = [p.numel() for p in ours.shards]

class Tied(nn.Module):  # the output layer's weight is the embedding's (one parameter in two modules)
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(11, 5), nn.Linear(5, 11)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.embed(tokens)))


def tied():
    torch.manual_seed(0)
    return Tied().to(device, torch.float64)


theirs, ours = tied(), tied()
fully_shard(theirs)
ours = HandFSDP(ours)
for model, finish in ((theirs, lambda: None), (ours, ours.finish)):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for tokens, _target in batches():
        optimizer.zero_grad()
        F.cross_entropy(model(tokens).double(), (tokens * 3) % 11).backward()
        finish()
        optimizer.step()
full_theirs = {name: p.full_tensor() for name, p in theirs.named_parameters()}
full_ours = ours.full_parameters()
found["tied_gap"] = max(gap([full_ours[n]], [full_theirs[n]]) for n in full_theirs)
found["tied_still"] = gap([full_ours["out.weight"]], [full_ours["embed.weight"]])
found["tied_shards"] = [p.numel() for p in ours.shards]


def same(a, b):  # equal structure, equal values, tensors equal to the bit
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    return a == b


def adam_run(sharded, steps, resume=None):  # no lr given: group 1 takes Adam's default, a scheduler halves it
    model = net()
    if resume:
        model.load_state_dict(resume["model"])
    optimizer = ShardedOptimizer(groups(model), torch.optim.Adam) if sharded else torch.optim.Adam(groups(model))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    if resume:
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
    ddp, done = DDP(model), resume["steps"] if resume else 0
    for tokens, target in list(batches(3))[done:done + steps]:
        optimizer.zero_grad()
        F.mse_loss(ddp(tokens).double(), target).backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                              "scheduler": scheduler.state_dict(), "steps": done + steps}


one_card, _, _ = adam_run(False, 3)
_, _, saved_one_card = adam_run(False, 2)
_, _, saved = adam_run(True, 2)
found["zero_state_dict_is_one_cards"] = same(saved["optimizer"], saved_one_card["optimizer"])
resumed, optimizer, _ = adam_run(True, 1, resume=saved)  # (as torch's own: the state goes on in saved's tensors)
found["zero_resumed_gap"] = gap(resumed.parameters(), one_card.parameters())
found["zero_resumed_state_numbers"] = sum(t.numel() for s in optimizer.local.state.values() for t in s.values()
                                          if t.dim())
found["zero_lrs"] = [group["lr"] for group in optimizer.param_groups]

# HandFSDP: keyword inputs cast to the compute dtype; a forward that raises leaves no hook nor whole weight
torch.manual_seed(0)
ours = HandFSDP(nn.Linear(5, 3).to(device, torch.float64), compute_dtype=torch.bfloat16)
found["fsdp_keyword_dtype"] = str(ours(input=torch.randn(2, 5, dtype=torch.float64, device=device)).dtype)
ours = HandFSDP(net())
try:
    ours(torch.tensor([11], device=device))  # no row 11 in an Embedding of 11 rows: its forward raises
    found["fsdp_raised"] = False
except IndexError:
    found["fsdp_raised"] = True
found["fsdp_hooks_left"] = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
found["fsdp_left_in_modules"] = [name for name, sub in ours.module.named_modules()
                                 if {"weight", "bias", "_fsdp_saving"} & set(sub.__dict__)]
theirs = DDP(net())
train(ours, torch.optim.SGD(ours.parameters(), lr=0.3), ours.finish)
train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.3))
full_ours = ours.full_parameters()
found["fsdp_after_error_gap"] = max(gap([full_ours[n]], [p]) for n, p in theirs.module.named_parameters())


class Unused(nn.Module):  # `spare` requires a gradient and never gets one
    def __init__(self):
        super().__init__()
        self.used, self.spare = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


for name, wrap in (("overlapped", OverlappedDDP), ("bucketed", lambda m: BucketedDDP(m, bucket_mb=0.00001))):
    ours = wrap(Unused().to(device, torch.float64))
    ours(torch.ones(2, 3, dtype=torch.float64, device=device)).sum().backward()
    try:
        ours.finish()
        found[f"unused_{name}"] = "no error"
    except RuntimeError as error:
        found[f"unused_{name}"] = str(error)
    for entry in ours.pending:  # the used layer's all-reduces went out on every rank: let them end
        entry[-1].wait()

report(**found)
dist.destroy_process_group()
exit_without_teardown()
'''


# The notebooks run again under another machine's rounding (test_other_rounding.py); so do these comparisons,
# whose bounds must hold on a learner's CPU as well as on ours.
ROUNDINGS = {"this-machine": {}, "another": ANOTHER_ROUNDING}


@pytest.mark.slow
@pytest.mark.parametrize("rounding", ROUNDINGS.values(), ids=ROUNDINGS.keys())
def test_the_reference_solutions_train_as_pytorchs_own(rounding: dict[str, str]) -> None:
    result = torchrun(SCRIPT, nproc=2, env=rounding, echo=False, doctor=False, timeout=300)
    for rank in (0, 1):
        found = result.reports[rank]
        for key in ("overlapped_ddp", "overlapped_ddp_no_sync", "bucketed_ddp", "sharded_optimizer"):
            assert found[key] <= 1e-14, (rank, key, found[key])  # float64: the same sums, in another order at most
        assert max(found["hand_fsdp"].values()) <= 1e-14, found["hand_fsdp"]
        # bf16 compute, float64 masters: the same casts and bf16 products as fully_shard's, so every weight is
        # equal after a step, except the layer used twice: fully_shard adds its two uses' gradients in bf16,
        # the solution reduce-scatters each use's gradient in the masters' dtype and adds them there
        bf16 = found["hand_fsdp_bf16"]
        assert all(bf16[name] == 0 for name in bf16 if not name.startswith("hidden.")), bf16
        assert bf16["hidden.weight"] > 0
        assert len(found["buckets"]) > 1  # a cap that small splits the model: several messages, one per bucket
        assert found["hand_fsdp_masters"] == ["torch.float64"] and found["hand_fsdp_bf16_masters"] == ["torch.float64"]
        assert found["hand_fsdp_shard_numbers"] == [28, 13, 18, 11]  # 55, 25, 35, 21 weights: ceil(n / 2), padded
        assert found["hand_fsdp_names"] is True, found["hand_fsdp_names"]
        # a weight tied between two modules: one shard, trained as fully_shard trains it, still tied after
        assert found["tied_shards"] == [28] and found["tied_still"] == 0, found
        assert found["tied_gap"] <= 1e-14, found["tied_gap"]
        # ZeRO-1's state dict: one card's Adam's, to the bit; resumed from it, the run goes on as one card's,
        # and each rank again holds its share only; a group with no lr has Adam's default, halved by the scheduler
        assert found["zero_state_dict_is_one_cards"] is True and found["zero_resumed_gap"] == 0, found
        assert found["zero_lrs"] == [0.01 * 0.5 ** 3, 1e-3 * 0.5 ** 3], found["zero_lrs"]
        # HandFSDP: a keyword input is cast too; after a forward that raised, nothing is left behind and the
        # model trains as DDP does
        assert found["fsdp_keyword_dtype"] == "torch.bfloat16", found
        assert found["fsdp_raised"] and not found["fsdp_hooks_left"] and found["fsdp_left_in_modules"] == [], found
        assert found["fsdp_after_error_gap"] <= 1e-14, found["fsdp_after_error_gap"]
        for name in ("overlapped", "bucketed"):  # a parameter without a gradient is named, with the likely cause
            said = found[f"unused_{name}"]
            assert said.startswith("no gradient reached spare.weight, spare.bias") and "did not use" in said, said
    # ZeRO-1: the two ranks' Adam states (2 numbers per parameter) add up to the model's, each holds part of it
    trainable = 55 + 25 + 5 + 7 + 7 + 21 + 3
    states = [result.reports[rank]["state_numbers"] for rank in (0, 1)]
    assert sum(states) == 2 * trainable and 0 < min(states), states
    resumed = [result.reports[rank]["zero_resumed_state_numbers"] for rank in (0, 1)]
    assert resumed == states, (resumed, states)
