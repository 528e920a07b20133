import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fourcard_helpers import MnistCNN, detect, load_mnist, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cudnn.allow_tf32 = False  # plain float32 convolutions (TF32 rounds to 10 bits), as in the notebook

STEPS, GLOBAL_BATCH, LR = 20, 64, 0.05
per_card = GLOBAL_BATCH // world
X, Y = load_mnist("train").tensors
order = torch.randperm(len(X), generator=torch.Generator().manual_seed(1))  # same order on every rank


def train(dtype):  # the same 20 steps in float32, then in float64: the notebook checks both
    # 1. Each rank builds its own copy; different seeds make the copies start apart...
    torch.manual_seed(rank)
    model = MnistCNN().to(device, dtype)
    before = model.fc2.bias.detach().cpu().clone()
    # ...so rank 0's weights are broadcast to all: now every copy starts the same.
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, calls, bytes_sent = [], 0, 0
    for step in range(STEPS):
        batch = order[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        mine = batch[rank * per_card:(rank + 1) * per_card]  # this card's shard of the batch
        x, y = X[mine].to(device, dtype), Y[mine].to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        # 2. The all-reduce, by hand: sum every gradient over the ranks, divide by their number.
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
            calls += 1
            bytes_sent += p.grad.numel() * p.grad.element_size()
        if step == 0:  # every run starts from the same weights here: the notebook judges float32 on this step
            first_gradient = torch.cat([p.grad.flatten() for p in model.parameters()]).cpu()
        optimizer.step()
        batch_loss = loss.detach().clone()  # the whole batch's loss: the mean of the shards' (for the record)
        dist.all_reduce(batch_loss)
        losses.append(batch_loss.item() / world)
        if rank == 0 and step % 5 == 0:
            print(f"{dtype} step {step:2d}  loss {losses[-1]:.4f}")
    weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()
    return dict(before=before, weights=weights, first_gradient=first_gradient, losses=losses, calls=calls,
                bytes_sent=bytes_sent)


report(float32=train(torch.float32), float64=train(torch.float64), shard=per_card, device=str(device))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
