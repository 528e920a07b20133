"""Lesson 13's GPT, one sequence cut head-tail over four ranks, float64, with the lean ring and with section 2's ring.
Reports the loss, each gradient's gap from one card, the bytes sent, the tensors' bytes after forward and at most."""
import copy, os, sys, weakref, torch, torch.distributed as dist, torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from fourcard_helpers import detect, report
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens
from fourcard_helpers.ring import LeanRingAttention, chunk_positions, ring_attention

class Meter(TorchDispatchMode):  # every operator passes through here: the bytes each send carries, and the bytes of
    def __init__(self):          # the tensors alive (a storage counted when made, uncounted when freed), and their peak
        super().__init__()
        self.phase, self.sent, self.live, self.peak, self.alive = "forward", {"forward": 0, "backward": 0}, 0, 0, {}
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sent[self.phase] += sum(t.nbytes for t in args[0]) if func._opname == "send" else 0
        tensors = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        for storage in [t.untyped_storage() for t in tensors]:
            if id(storage) not in self.alive:
                self.alive[id(storage)] = storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, lambda key=id(storage): setattr(self, "live", self.live - self.alive.pop(key)))
        return out

T = 512
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
stream, chars = poem_tokens()
torch.manual_seed(0)
one_card = GPT(GPTConfig(vocab_size=len(chars), block_size=T)).to(device, torch.float64)   # the same on every rank
copies = [copy.deepcopy(one_card) for _ in range(2)]  # one for each ring, made before any gradient
x, y = (t.to(device) for t in get_batch(stream, 1, T, torch.Generator().manual_seed(0)))   # one sequence of T
(one_card_loss := one_card(x, y)[1]).backward()      # the yardstick: one card, the whole sequence
mine = torch.cat(chunk_positions(dist.get_rank(), dist.get_world_size(), T, balanced=True)).to(device)   # front, back

def context_parallel_loss(model, attention):          # lesson 13's GPT.forward, on my positions only
    h = model.tok_embeddings(x[:, mine]) + model.pos_embeddings(mine)   # each token at its place in the sequence
    for block in model.layers:
        a, z = block.attention, block.attention_norm(h)
        q, k, v = (w(z).view(1, len(mine), -1, a.head_dim).transpose(1, 2) for w in (a.wq, a.wk, a.wv))
        h = h + a.wo(attention(q, k, v, T, True).transpose(1, 2).reshape(1, len(mine), -1))
        h = h + block.mlp(block.mlp_norm(h))
    logits = model.output(model.norm(h))   # my tokens' part of the mean over all T: the four parts add up to the loss
    return F.cross_entropy(logits.flatten(0, 1), y[:, mine].flatten(), reduction="sum") / T

def gaps(model):                                      # each parameter's largest |gap|, as a share of its largest entry
    return {name: ((p.grad - q.grad).abs().max() / q.grad.abs().max()).item()
            for (name, p), q in zip(model.named_parameters(), one_card.parameters())}
runs = {}
for model, (ring, attention) in zip(copies, (("lean", LeanRingAttention.apply), ("keeps every block", ring_attention))):
    with Meter() as meter:
        loss = context_parallel_loss(model, attention)
        meter.phase, kept = "backward", meter.live    # what forward left for backward
        loss.backward()
    own_part = max(gaps(model).values())              # before the sum over the ranks: far from one card
    for p in model.parameters():                      # each rank's part of every gradient: added over the ranks
        dist.all_reduce(p.grad)
    dist.all_reduce(loss.detach())                    # the four parts of the loss, added
    runs[ring] = dict(loss=loss.item(), gaps=gaps(model), own_part=own_part, sent=meter.sent, kept=kept, peak=meter.peak)
report(one_card_loss=one_card_loss.item(), **runs)
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
