"""The cost model's rule for the gradients' dtype, against what DDP and FSDP2 send in a real 2-rank launch."""
from fourcard_helpers import costmodel


COUNT_REDUCTIONS = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook, bf16_compress_hook
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils._python_dispatch import TorchDispatchMode
from fourcard_helpers import report

class Sent(TorchDispatchMode):  # every collective passes through as an operator: its dtype and the whole tensor's bytes
    def __init__(self):
        super().__init__()
        self.seen = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            whole = args[1] if "reduce_scatter" in func._opname else args[0]   # a reduce-scatter's input
            whole = whole[0] if isinstance(whole, list) else whole
            self.seen.append((func._opname, str(whole.dtype).removeprefix("torch."), whole.nbytes))
        return func(*args, **(kwargs or {}))

dist.init_process_group("gloo")
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))   # every dim even: no padding of shards
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
out = {}
for hook_name, hook in ((None, allreduce_hook), ("bf16", bf16_compress_hook)):
    buckets, sent = [], Sent()
    def counting(state, bucket, hook=hook):   # note the bucket, then DDP's own hook, counted as it sends
        buckets.append((str(bucket.buffer().dtype).removeprefix("torch."), bucket.buffer().nbytes))
        with sent:
            return hook(state, bucket)
    model = DDP(net())
    model.register_comm_hook(None, counting)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    out[f"DDP {hook_name}"] = {"buckets": buckets, "sent": sent.seen,
                               "grads": sorted({str(p.grad.dtype) for p in model.parameters()})}
for reduce in ("float32", "bfloat16", None):
    model = net()
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=reduce and getattr(torch, reduce)))
    loss = model(x).float().square().mean()
    with Sent() as sent:
        loss.backward()
    out[f"FSDP {reduce}"] = {"sent": sent.seen, "grads": sorted({str(p.grad.to_local().dtype) for p in model.parameters()})}
report(parameters=sum(p.numel() for p in net().parameters()), **out)
dist.destroy_process_group()
"""


def test_gradient_dtype_matches_what_ddp_and_fsdp2_send():
    """One 2-rank launch: DDP under bf16 autocast (default hook, then bf16_compress_hook) and FSDP2 with bf16
    param_dtype and three reduce_dtypes; every collective of backward counted as it is called."""
    from fourcard_helpers.launch import leftover_processes, torchrun

    reports = torchrun(COUNT_REDUCTIONS, nproc=2, timeout=180, echo=False).reports
    assert leftover_processes() == []
    for r in (0, 1):
        got = reports[r]
        n = got["parameters"]
        for hook in (None, "bf16"):
            run = got[f"DDP {hook}"]
            assert run["grads"] == ["torch.float32"]   # autocast leaves the gradients in the parameters' dtype
            assert run["buckets"] == [["float32", 4 * n]]   # the buckets hold them, 4 B a parameter
            expected = costmodel.gradient_dtype("DDP", "fp32", "bf16", compress_hook=hook)
            assert [op for op, _, _ in run["sent"]] == ["allreduce_"]
            assert costmodel.dtype_bytes(run["sent"][0][1]) == costmodel.dtype_bytes(expected)
            assert run["sent"][0][2] == costmodel.gradient_bytes(n, expected)
        assert got["DDP None"]["sent"][0][1] == "float32" and got["DDP bf16"]["sent"][0][1] == "bfloat16"
        for reduce in ("float32", "bfloat16", None):
            run = got[f"FSDP {reduce}"]
            expected = costmodel.gradient_dtype("FSDP", "fp32", "bf16", reduce_dtype=reduce)
            assert [op for op, _, _ in run["sent"]] == ["_reduce_scatter_base_"]
            assert run["sent"][0][1:] == [{"fp32": "float32", "bf16": "bfloat16"}[expected],
                                          costmodel.gradient_bytes(n, expected)]
            assert run["grads"] == ["torch.float32"]   # the reduced shard is cast back to the parameters' dtype
