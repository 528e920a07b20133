"""Lesson 13's GPT on a 2 × 2 mesh (dp × tp + sequence): first gradients, weights after 4 steps, last step's collectives."""
import os, sys, warnings, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from fourcard_helpers import detect, report
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens

class Collectives(TorchDispatchMode):          # every collective passes through as an operator: note what and how big
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types: return NotImplemented   # DTensor runs first: the collectives it issues then come here
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in ("wait_tensor", "_wrap_tensor_autograd"):
            tensor = args[0][0] if isinstance(args[0], list) else args[0]
            times = args[1] if func._opname == "all_gather_into_tensor" else 1     # its input is one card's part
            self.seen.append((func._opname, tensor.nbytes * times))
        return func(*args, **(kwargs or {}))
warnings.filterwarnings("ignore", "Full backward hook is firing")   # CommDebugMode's module hooks: the input is characters
STEPS, BATCH = 4, 32
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda": torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (2, 2), mesh_dim_names=("dp", "tp"))
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars))
half = slice(mesh.get_local_rank("dp") * BATCH // 2, (mesh.get_local_rank("dp") + 1) * BATCH // 2)
halves, whole = (Shard(1),), (Replicate(),)      # layouts of the activations: halves of the sequence, or all of it
BLOCK = {"attention_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),   # the plan of every block
         **{name: PrepareModuleInput(input_layouts=halves, desired_input_layouts=whole) for name in ("attention", "mlp")},
         **{name: ColwiseParallel() for name in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1")},
         **{name: RowwiseParallel(output_layouts=Shard(1)) for name in ("attention.wo", "mlp.w2")}}
results = {}                                     # per dtype: the first step's gradient and the last weights, whole
gathered = lambda ts: torch.cat([(t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().flatten() for t in ts])
for dtype in (torch.float64, torch.float32):
    torch.manual_seed(0)
    model = GPT(config).to(device, dtype)
    parallelize_module(model, mesh["tp"], {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "layers.0": PrepareModuleInput(input_layouts=whole, desired_input_layouts=halves, use_local_output=True),
        **{f"layers.{i}.{name}": style for i in range(config.n_layer) for name, style in BLOCK.items()},
        "norm": SequenceParallel(), "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    model.output.weight = model.tok_embeddings.weight       # parallelize_module untied them: tie them again
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(0)                 # section 3's batches; each dp pair takes its half
    for step in range(STEPS):
        x, y = get_batch(tokens, BATCH, config.block_size, data)
        with CommDebugMode() as debug, Collectives() as counted:   # PyTorch's own count beside ours
            counted.seen = []
            _, loss = model(x[half].to(device), y[half].to(device))
            optimizer.zero_grad()
            loss.backward()
            for p in model.parameters():
                if isinstance(p.grad, DTensor) and p.grad.placements[0].is_partial():   # the norms: add the halves
                    p.grad = p.grad.redistribute(placements=[Replicate()])
                local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(local.div_(2), group=mesh.get_group("dp"))  # data parallel: average over the dp pair (halves added)
            first = gathered(p.grad for p in model.parameters()) if step == 0 else first   # every rank gathers
            optimizer.step()                                # counted too
    results[str(dtype).removeprefix("torch.")] = {"gradient": first, "weights": gathered(model.parameters())}
report(results=results if dist.get_rank() == 0 else None, collectives=counted.seen, debug={op.__name__: n for op, n in debug.get_comm_counts().items()},
       local_parameters=sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()))
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
