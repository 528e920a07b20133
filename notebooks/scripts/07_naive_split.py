"""MnistCNN cut into four stages, one per card, trained with plain send/recv: who works when."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fourcard_helpers import detect, report, load_mnist, exit_without_teardown
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
first, last = rank == 0, rank == world - 1

def now():
    if cards.kind == "cuda":
        torch.cuda.synchronize()  # GPU work is asynchronous: let it finish before reading the clock
    return time.perf_counter()    # one clock for all processes of this machine

CUTS = [0, 3, 6, 9, 10]  # stage 0: conv1 block | 1: conv2 block | 2: fc1 + ReLU | 3: fc2
BATCH, STEPS = 256, 4
images, labels = load_mnist("train").tensors
for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):  # float64: the exactness check
    torch.manual_seed(0)
    layers = MnistCNN().as_sequential().to(dtype)  # every rank builds the same model from the same seed ...
    with torch.no_grad():  # ... notes the shape of what crosses each cut (for the recv buffers) ...
        cut_shapes = [tuple(layers[:c](images[:BATCH].to(dtype)).shape) for c in CUTS[1:-1]]
    stage = layers[CUTS[rank]:CUTS[rank + 1]].to(device)  # ... and keeps only its own stage
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.05)
    events = []
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        x, y = images[batch].to(device, dtype), labels[batch].to(device)
        optimizer.zero_grad()
        dist.barrier()  # every step starts together, so its timeline stands on its own
        inputs = x if first else torch.empty(cut_shapes[rank - 1], device=device, dtype=dtype)
        if not first:   # forward: receive the previous stage's output, compute, pass ours on
            dist.recv(inputs, src=rank - 1)
            inputs.requires_grad_()  # we will need the gradient with respect to it
        start = now()
        outputs = stage(inputs)
        loss = F.cross_entropy(outputs, y) if last else None
        events.append((step, start, now(), "forward"))
        if not last:    # backward: receive d(loss)/d(our output), backpropagate, pass d(loss)/d(our input) back
            dist.send(outputs.detach(), dst=rank + 1)
            grad = torch.empty_like(outputs)
            dist.recv(grad, src=rank + 1)
        start = now()
        (loss if last else outputs).backward(None if last else grad)
        events.append((step, start, now(), "backward"))
        if not first:
            dist.send(inputs.grad, dst=rank - 1)
        optimizer.step()
        if step == 0:  # step 1 starts from the same weights everywhere: the float32 check's moment
            logits = outputs.detach() if last else None
            weights_after_one = {key: value.clone() for key, value in stage.state_dict().items()}
    report(**{name: dict(events=events, weights=stage.state_dict(), weights_after_one=weights_after_one, logits=logits,
                         peak_bytes=torch.cuda.max_memory_allocated(device) if cards.kind == "cuda" else None)})
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
