"""Lesson 13's GPT on a 2 × 2 mesh as torchtitan composed it for Llama 3: tensor + sequence parallel over "tp", then FSDP2 over "dp", the loss by
loss_parallel. First gradients, losses, 4 steps' weights, collectives with and without loss_parallel; the model saved with DCP."""
import logging
import os
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens

class Collectives(TorchDispatchMode):          # every collective passes through as an operator: note what and how big
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types:                     # DTensor runs first: the collectives it issues then come here
            return NotImplemented
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in ("wait_tensor", "_wrap_tensor_autograd"):
            tensors = [t for a in args[:2] for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
            times = args[1] if func._opname == "all_gather_into_tensor" else 1     # funcol's gather is handed one card's part
            self.seen.append((func._opname, max(t.nbytes for t in tensors) * times))   # a message's size: its whole tensor
        return func(*args, **(kwargs or {}))
warnings.filterwarnings("ignore", "Full backward hook is firing|FSDP2-wrapped module|Detected an existing checkpoint")   # said of
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)   # CommDebugMode's hooks (the input is characters),
STEPS, BATCH, FOLDER = 4, 32, os.path.join(tempfile.gettempdir(), "fourcards_13_2d")   # of views no line changes, of the last run's
# checkpoint, which is replaced; PyTorch logs that gathering the tied table whole takes one all-gather per mesh dimension
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (2, 2), mesh_dim_names=("dp", "tp"))
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars))
BLOCK = {"attention_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),   # the plan of every block: Shard(1), halves of the sequence
         **{name: PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()) for name in ("attention", "mlp")},
         **{name: ColwiseParallel() for name in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1")},
         **{name: RowwiseParallel(output_layouts=Shard(1)) for name in ("attention.wo", "mlp.w2")}}
results, losses, gathered = {}, {}, lambda ts: torch.cat([t.full_tensor().detach().cpu().flatten() for t in ts])   # whole
for dtype in (torch.float64, torch.float32):
    torch.manual_seed(0)
    model = GPT(config).to(device, dtype)
    parallelize_module(model, mesh["tp"], {      # 1. tensor + sequence parallel over tp; the scores stay split (Shard(-1))
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "layers.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=True),
        **{f"layers.{i}.{name}": style for i in range(config.n_layer) for name, style in BLOCK.items()}, "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    model.output.weight = model.tok_embeddings.weight       # parallelize_module untied them: tie them again
    for block in model.layers:                   # 2. FSDP2 over dp: each block a unit,
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])                              #    the rest the root
    optimizer, data, name = torch.optim.AdamW(model.parameters(), lr=3e-3), torch.Generator().manual_seed(0), str(dtype)[6:]
    for step in range(STEPS):                    # section 3's batches; each dp pair takes its half
        x, y = (t.chunk(2)[mesh.get_local_rank("dp")].to(device) for t in get_batch(tokens, BATCH, config.block_size, data))
        with CommDebugMode() as debug, Collectives() as counted, loss_parallel():   # PyTorch's count beside ours
            _, loss = model(x, y)                # cross-entropy on each card's part of the scores
            loss.backward()
            first = gathered(p.grad for p in model.parameters()) if step == 0 else first
            optimizer.step()                     # counted too
            optimizer.zero_grad()
        losses.setdefault(name, []).append(loss.full_tensor().item())   # the mean over this dp pair's windows
    results[name] = {"gradient": first, "weights": gathered(model.parameters())}
with CommDebugMode() as whole_debug, Collectives() as whole_counted:   # one step more, the scores gathered whole first
    F.cross_entropy(model(x)[0].full_tensor().flatten(0, 1), y.flatten()).backward()
dcp.save(get_model_state_dict(model), checkpoint_id=FOLDER)   # the float32 model: each rank writes its own pieces
counts = lambda mode: {op.__name__: n for op, n in mode.get_comm_counts().items()}
report(results=results if rank == 0 else None, losses=losses, collectives=counted.seen, debug=counts(debug),
       whole=whole_counted.seen, whole_debug=counts(whole_debug), local_parameters=sum(p.to_local().numel() for p in model.parameters()))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
