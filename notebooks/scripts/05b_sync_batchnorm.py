"""BatchNorm under DDP: statistics of each card's 16 digits, or of all four cards' 64 (SyncBatchNorm)."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNNWithBatchNorm

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cudnn.allow_tf32 = False  # full float32, to compare with the notebook's CPU reference
images, labels = (t[16 * rank:16 * (rank + 1)].to(device) for t in load_mnist("train").tensors)  # my 16 of 64


class SumOverRanks(torch.autograd.Function):
    """all_reduce with a backward: every rank's output is the sum of all ranks' inputs, so gradients sum too."""
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    backward = forward  # the gradient of a sum over ranks: the sum over ranks of the gradients


class AllReduceBatchNorm2d(nn.BatchNorm2d):
    """What nn.SyncBatchNorm computes in training (it refuses CPU tensors): batch statistics over ALL ranks."""
    def forward(self, x):
        sums = SumOverRanks.apply(torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), x.new_tensor([x[:, 0].numel()])]))
        c, n = x.shape[1], sums[-1]  # per channel, over all ranks: sums of values and squares; n values
        mean, var = sums[:c] / n, sums[c:2 * c] / n - (sums[:c] / n) ** 2
        with torch.no_grad():  # running mean and variance, kept as BatchNorm keeps them
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)
        x = (x - mean.view(1, c, 1, 1)) / torch.sqrt(var.view(1, c, 1, 1) + self.eps)
        return x * self.weight.view(1, c, 1, 1) + self.bias.view(1, c, 1, 1)


after_one_step = {}
for kind, dtype in [(kind, dtype) for kind in ("BatchNorm", "SyncBatchNorm") for dtype in (torch.float32, torch.float64)]:
    torch.manual_seed(0)
    net = MnistCNNWithBatchNorm().to(device, dtype)
    if kind == "SyncBatchNorm" and cards.kind == "cuda":
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)  # the real thing, on GPUs
    elif kind == "SyncBatchNorm":
        net.bn1, net.bn2 = AllReduceBatchNorm2d(10).to(device, dtype), AllReduceBatchNorm2d(20).to(device, dtype)
    net = DDP(net, device_ids=[device] if cards.kind == "cuda" else None)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    F.cross_entropy(net(images.to(dtype)), labels).backward()
    optimizer.step()
    after_one_step[f"{kind}, {str(dtype).removeprefix('torch.')}"] = {k: v.cpu() for k, v in net.module.state_dict().items()}
report(after_one_step=after_one_step)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
