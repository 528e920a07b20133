import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, SplitPoint, pipeline

from fourcard_helpers import detect, report, load_mnist, exit_without_teardown
from fourcard_helpers.models import MnistCNN

# torch.export (inside pipeline()) warns about an internal deprecation that is not ours to fix
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
CUTS = [0, 3, 6, 9, 10]
MICRO_BATCHES, STEPS = 4, 3
images, labels = load_mnist("train").tensors
weights = {"float32": {}, "float64": {}}
after_one = {"float32": {}, "float64": {}}  # after step 1, for the float32 check (it starts from the same weights)
for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):  # float64: the exactness check
    x, y = images[:64].to(device, dtype), labels[:64].to(device)
    torch.manual_seed(0)
    layers = MnistCNN().as_sequential().to(device, dtype)
    initial = {key: value.clone() for key, value in layers.state_dict().items()}
    # traced: the whole model is traced once and cut before layers 3, 6 and 9
    pipe = pipeline(layers, mb_args=(x[:64 // MICRO_BATCHES],),
                    split_spec={str(CUTS[s]): SplitPoint.BEGINNING for s in range(1, world)})
    for build in ("by hand", "traced"):
        for Schedule in (ScheduleGPipe, Schedule1F1B):
            layers.load_state_dict(initial)  # every setup starts from the same weights
            if build == "by hand":
                part = layers[CUTS[rank]:CUTS[rank + 1]]
                stage = PipelineStage(part, rank, world, device)
            else:
                part = pipe.get_stage_module(rank)
                part.load_state_dict({key: initial[key] for key in part.state_dict()})
                stage = pipe.build_stage(rank, device)
            optimizer = torch.optim.SGD(part.parameters(), lr=0.1)
            schedule = Schedule(stage, n_microbatches=MICRO_BATCHES, loss_fn=F.cross_entropy)
            for step in range(STEPS):
                optimizer.zero_grad()
                if rank == 0:
                    schedule.step(x)
                elif rank == world - 1:
                    schedule.step(target=y)
                else:
                    schedule.step()
                optimizer.step()
                if step == 0:
                    after_one[name][f"{build}, {Schedule.__name__}"] = {k: v.clone() for k, v in part.state_dict().items()}
            # clone: the next setup reloads the initial weights into these same tensors
            weights[name][f"{build}, {Schedule.__name__}"] = {key: value.clone() for key, value in part.state_dict().items()}
            if rank == 0:
                print(f"{name} {build:8} {Schedule.__name__:13} done", flush=True)
report(weights=weights, after_one=after_one)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
