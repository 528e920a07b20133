"""Sharding by hand: ZeRO-1's optimizer and FSDP's weights (lesson 09's build exercises).

Each class is the reference solution of a build exercise (fourcard_helpers/exercises), and the text
of the lesson's hidden solution cell (tests/test_exercises.py keeps the two equal). They run in any
process group their caller made (gloo or NCCL, any number of ranks) and are compared with PyTorch's
ZeroRedundancyOptimizer and fully_shard in tests/test_solutions.py.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank steps (and keeps the state of) its own share of the parameters, then every rank
    receives every updated parameter from its owner."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        rank, world = dist.get_rank(), dist.get_world_size()
        every = [p for group in self.param_groups for p in group["params"]]
        load = [0] * world
        self.owner = {}
        for param in sorted(every, key=lambda p: -p.numel()):  # the largest first, to the least loaded rank
            self.owner[param] = load.index(min(load))
            load[self.owner[param]] += param.numel()
        mine = [{**group, "params": [p for p in group["params"] if self.owner[p] == rank]}
                for group in self.param_groups]
        self.groups = [k for k, group in enumerate(mine) if group["params"]]  # which of ours each local group is
        self.local = optimizer_cls([mine[k] for k in self.groups], **kwargs) if self.groups else None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        if self.local is not None:
            for k, local in zip(self.groups, self.local.param_groups):
                local.update({key: value for key, value in self.param_groups[k].items() if key != "params"})
            self.local.step()  # the state of our share only
        for group in self.param_groups:
            for param in group["params"]:
                dist.broadcast(param.data, src=self.owner[param])
        return loss


class _Gather(torch.autograd.Function):
    """The whole weight from every rank's shard; in backward, the gradient reduce-scattered into the shard."""

    @staticmethod
    def forward(ctx, shard, fsdp, k):
        ctx.fsdp, ctx.k = fsdp, k
        return fsdp.gather(k)

    @staticmethod
    def backward(ctx, grad):
        master = ctx.fsdp.shards[ctx.k]
        flat = torch.zeros(ctx.fsdp.padded[ctx.k], dtype=master.dtype, device=grad.device)
        flat[:grad.numel()] = grad.reshape(-1)
        shard = flat.new_empty(flat.numel() // dist.get_world_size())
        dist.reduce_scatter_tensor(shard, flat)
        return shard / dist.get_world_size(), None, None


class HandFSDP(nn.Module):
    """FSDP by hand: the weight of every module of `shard_types` lives as 1/N on each rank (flat, padded),
    gathered before its module's forward and again before its backward, freed after each use; its
    gradient is reduce-scattered into the shard. Every other parameter stays whole (gradient all-reduced).
    `compute_dtype` (bf16, fp16): weights gathered and used in it; masters, their gradients and the optimizer
    keep the model's own dtype (float32). A weight tied between modules (one parameter in both) keeps one shard,
    gathered for each use; its gradient is the sum of both uses'."""

    def __init__(self, module, compute_dtype=None, shard_types=(nn.Linear, nn.Embedding)):
        super().__init__()
        self.module, self.dtype = module, compute_dtype
        rank, world = dist.get_rank(), dist.get_world_size()
        self.shards, self.whole = nn.ParameterList(), nn.ParameterList()
        self.shapes, self.padded, self.names, self.places = [], [], [], []
        seen = {}  # id(parameter): (sharded, k); a weight tied between modules keeps one shard
        for module_name, sub in module.named_modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                del sub._parameters[name]
                self.names.append(f"{module_name}.{name}" if module_name else name)
                if id(param) in seen:
                    self.places.append((sub, name, *seen[id(param)]))
                    continue
                dist.broadcast(param.data, src=0)
                sharded = isinstance(sub, shard_types) and name == "weight"
                if sharded:
                    per_rank = -(-param.numel() // world)  # ceil: the last rank's shard is padded
                    flat = torch.zeros(per_rank * world, dtype=param.dtype, device=param.device)
                    flat[:param.numel()] = param.detach().reshape(-1)
                    self.shards.append(nn.Parameter(flat[rank * per_rank:(rank + 1) * per_rank].clone(),
                                                    requires_grad=param.requires_grad))
                    self.shapes.append(param.shape)
                    self.padded.append(per_rank * world)
                else:
                    self.whole.append(nn.Parameter(param.detach(), requires_grad=param.requires_grad))
                seen[id(param)] = sharded, len(self.shards if sharded else self.whole) - 1
                self.places.append((sub, name, *seen[id(param)]))
            if any(place[0] is sub for place in self.places):
                sub.register_forward_pre_hook(self._before)
                sub.register_forward_hook(self._after)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def gather(self, k):
        """Sharded weight k, whole, in the compute dtype (a new tensor each call)."""
        shard = self.shards[k].detach().to(self.dtype or self.shards[k].dtype)
        flat = shard.new_empty(self.padded[k])
        dist.all_gather_into_tensor(flat, shard)
        return flat[:self.shapes[k].numel()].view(self.shapes[k])

    def _before(self, sub, args):
        gathered = {}
        for owner, name, sharded, k in self.places:
            if owner is sub:
                if sharded:
                    weight = _Gather.apply(self.shards[k], self, k)
                    gathered[weight.untyped_storage().data_ptr()] = k
                else:
                    weight = self.whole[k] if self.dtype is None else self.whole[k].to(self.dtype)
                sub.__dict__[name] = weight  # a plain attribute, for this forward only
        sub._fsdp_saving = torch.autograd.graph.saved_tensors_hooks(
            lambda t: self._pack(t, gathered), self._unpack)
        sub._fsdp_saving.__enter__()
        if self.dtype is not None:
            return tuple(a.to(self.dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def _after(self, sub, args, output):
        sub._fsdp_saving.__exit__(None, None, None)
        for owner, name, _sharded, _k in self.places:
            if owner is sub:
                del sub.__dict__[name]  # the whole weight is freed; backward gathers it again

    def _pack(self, tensor, gathered):
        k = gathered.get(tensor.untyped_storage().data_ptr())
        if k is None:
            return tensor
        return k, tensor.size(), tensor.stride(), tensor.storage_offset()

    def _unpack(self, saved):
        if torch.is_tensor(saved):
            return saved
        k, size, stride, offset = saved
        return self.gather(k).as_strided(size, stride, offset)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self):
        """After backward, before the optimizer's step: average the whole parameters' gradients (the shards'
        were reduce-scattered during backward)."""
        for param in self.whole:
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad /= dist.get_world_size()

    def full_parameters(self):
        """Every parameter whole, in the masters' dtype, by its name in the wrapped module."""
        full = {}
        for name, (_owner, _name, sharded, k) in zip(self.names, self.places):
            if sharded:
                shard = self.shards[k].detach()
                flat = shard.new_empty(self.padded[k])
                dist.all_gather_into_tensor(flat, shard)
                full[name] = flat[:self.shapes[k].numel()].view(self.shapes[k]).clone()
            else:
                full[name] = self.whole[k].detach().clone()
        return full
