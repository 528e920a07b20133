"""torch.compile under DDP: Dynamo cuts the graph where DDP's gradient buckets end."""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, report, exit_without_teardown

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--bucket-caps", default="default,1", help="bucket_cap_mb values to try ('default': not set)")
args = parser.parse_args()

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
graphs = []


def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    """A compiler that compiles nothing: it notes how many Linear layers each graph holds and runs it as is."""
    graphs.append(sum(1 for node in gm.graph.nodes if "linear" in str(node.target)))
    return gm.forward


found = {}
for cap in args.bucket_caps.split(","):
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)]).to(device)  # 4 layers of 1 MiB of weights
    torch._dynamo.reset()  # forget earlier compilations
    graphs.clear()
    # Compile the module, then wrap it: it runs inside DDP's forward, where Dynamo sees DDP's buckets.
    model = DDP(torch.compile(net, backend=counting_backend), bucket_cap_mb=None if cap == "default" else float(cap),
                device_ids=[device] if cards.kind == "cuda" else None)
    x = torch.randn(16, 512, device=device)
    model(x).sum().backward()  # step 1 compiles; DDP uses one bucket, then builds its real buckets
    with torch.profiler.profile() as prof:  # step 2: count DDP's all-reduces
        model(x).sum().backward()
    all_reduces = [event.name for event in prof.events()].count("c10d::allreduce_")
    found[cap] = {"linear_layers_per_graph": list(graphs), "ddp_all_reduces": all_reduces}
report(found=found)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
