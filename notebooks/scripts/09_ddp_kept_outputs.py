import os
import weakref
from itertools import count

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import MnistCNN, detect, load_mnist, report, exit_without_teardown
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
X, Y = load_mnist("test").tensors
torch.manual_seed(0)
model = DDP(MnistCNN().to(device)).eval()

def held(tensors):                                     # bytes of distinct storages
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

def evaluate(leaky, batch=32):
    alive, ids = weakref.WeakValueDictionary(), count()    # every tensor autograd saves, while it lives
    def pack(t):                                       # a detached view, as in AliveSaved: `t` itself holds its
        alive[next(ids)] = saved = t.detach()          # grad_fn, which would hold `t` (a cycle only backward breaks)
        return saved
    outputs, labels, kept, cuda = [], [], [], []
    start = torch.cuda.memory_allocated() if cards.kind == "cuda" else 0
    for first in range(rank * batch, len(X), world * batch):   # this rank's batches
        x, y = X[first:first + batch].clone().to(device), Y[first:first + batch].clone().to(device)
        if leaky:                                      # outputs kept, graphs and all
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                outputs.append(model(x))
        else:                                          # no graph; keep only what the metric needs
            with torch.no_grad():
                outputs.append(model(x).argmax(1))
        labels.append(y)
        kept.append(held(list(alive.values()) + outputs))
        if cards.kind == "cuda":
            cuda.append(torch.cuda.memory_allocated() - start)
    predicted = torch.cat([o.argmax(1) if leaky else o for o in outputs])
    counts = torch.tensor([(predicted == torch.cat(labels)).sum().item(), len(predicted)], device=device)
    dist.all_reduce(counts)                            # correct and total, over all ranks
    return kept, cuda, (counts[0] / counts[1]).item()

leaky, fixed = evaluate(leaky=True), evaluate(leaky=False)
report(leaky=leaky, fixed=fixed, batch_bytes=32 * 28 * 28 * 4)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
