"""DDP on MNIST digits on however many nodes and ranks torchrun starts: each rank says where it runs."""
import hashlib
import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

# torchrun (one agent per node) told each rank where it is in the world:
where = {name: int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
cards = detect(where["LOCAL_WORLD_SIZE"])  # the cards of THIS node: a node's GPUs are numbered from 0
dist.init_process_group(cards.backend)
device = cards.device(where["LOCAL_RANK"])
if cards.kind == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cudnn.allow_tf32 = False  # full float32, so that layouts can be compared
    torch.backends.cudnn.deterministic = True  # the same convolution algorithms, run after run
# The rest is the DDP recipe of lesson 05, unchanged: nothing in it knows about nodes.
train_set = Subset(load_mnist("train"), range(1024))
sampler = DistributedSampler(train_set, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=64 // where["WORLD_SIZE"], sampler=sampler)  # a global batch of 64
torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for images, labels in loader:
    optimizer.zero_grad()
    F.cross_entropy(model(images.to(device)), labels.to(device)).backward()
    optimizer.step()
weights = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu().numpy().tobytes()
report(**where, host=socket.gethostname(), agent_pid=os.getppid(), steps=len(loader),
       weights_sha256=hashlib.sha256(weights).hexdigest(),
       CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES"),  # which GPUs this node's agent was given
       TORCH_NCCL_ASYNC_ERROR_HANDLING=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))  # section 5
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
