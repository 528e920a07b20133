"""Sharding by hand: ZeRO-1's optimizer and FSDP's weights (lesson 09's build exercises).

Each class is the reference solution of a build exercise (fourcard_helpers/exercises), and the text
of the lesson's hidden solution cell (tests/process/test_exercises.py keeps the two equal). They run in any
process group their caller made (gloo or NCCL, any number of ranks) and are compared with PyTorch's
ZeroRedundancyOptimizer and fully_shard in tests/lessons/test_solutions.py.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank steps (and keeps the state of) its own share of the parameters, then every rank
    receives every updated parameter from its owner. state_dict() and load_state_dict() speak one card's format."""

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
        self.local = optimizer_cls(mine, **kwargs)  # group k is our share of group k (perhaps none of it)
        for group, local in zip(self.param_groups, self.local.param_groups):
            for key, value in local.items():  # optimizer_cls's defaults (lr, betas...): schedulers read them
                group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({key: value for key, value in group.items() if key != "params"})  # a scheduler's lr
        self.local.step()  # the state of our share only
        for group in self.param_groups:
            for param in group["params"]:
                dist.broadcast(param.data, src=self.owner[param])
        return loss

    def state_dict(self):
        """One card's state dict of optimizer_cls: every rank's share of the state, gathered onto every rank
        (on the CPU). A collective: call it on every rank, save it from one."""
        index = {p: i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        mine = {index[p]: {key: value.cpu() if torch.is_tensor(value) else value for key, value in state.items()}
                for p, state in self.local.state.items()}
        shares = [None] * dist.get_world_size()
        dist.all_gather_object(shares, mine)
        saved = super().state_dict()  # every group's settings, its parameters by index; our own .state is empty
        saved["state"] = dict(sorted(item for share in shares for item in share.items()))
        return saved

    def load_state_dict(self, state_dict):
        """A state dict of one card's optimizer_cls (or of state_dict() above): every group's settings, and on
        each rank the state of its own share only."""
        super().load_state_dict({**state_dict, "state": {}})
        every = [p for group in self.param_groups for p in group["params"]]
        local_index = {p: i for i, p in enumerate(p for group in self.local.param_groups for p in group["params"])}
        self.local.load_state_dict({
            "state": {local_index[every[i]]: state for i, state in state_dict["state"].items()
                      if every[i] in local_index},
            "param_groups": [{**saved, "params": [local_index[p] for p in local["params"]]}
                             for saved, local in zip(state_dict["param_groups"], self.local.param_groups)]})


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
    gathered for each use; its gradient is the sum of both uses'. A module called twice in one forward is gathered
    and reduce-scattered at each call (fully_shard adds the calls' gradients and reduce-scatters once).
    Floating-point inputs, positional or keyword, are cast to `compute_dtype` only where a module that owns
    parameters is called: a module without parameters of its own that gets a float32 keyword computes in float32,
    where fully_shard (cast_forward_inputs) casts the inputs of every module it wraps, the root included."""

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
                sub.register_forward_pre_hook(self._before, with_kwargs=True)
                sub.register_forward_hook(self._after, always_call=True)  # also when forward raises
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def gather(self, k):
        """Sharded weight k, whole, in the compute dtype (a new tensor each call)."""
        shard = self.shards[k].detach().to(self.dtype or self.shards[k].dtype)
        flat = shard.new_empty(self.padded[k])
        dist.all_gather_into_tensor(flat, shard)
        return flat[:self.shapes[k].numel()].view(self.shapes[k])

    def _before(self, sub, args, kwargs):
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
        if self.dtype is not None:  # floating-point inputs in the compute dtype, positional or keyword
            return tuple(map(self._cast, args)), {key: self._cast(value) for key, value in kwargs.items()}

    def _cast(self, value):
        return value.to(self.dtype) if torch.is_tensor(value) and value.is_floating_point() else value

    def _after(self, sub, args, output):
        saving = sub.__dict__.pop("_fsdp_saving", None)  # None if _before failed before setting it
        if saving is not None:
            saving.__exit__(None, None, None)
        for owner, name, _sharded, _k in self.places:
            if owner is sub:
                sub.__dict__.pop(name, None)  # the whole weight is freed; backward gathers it again

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
