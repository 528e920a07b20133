import os
import torch

rank = int(os.environ["RANK"])
samples = torch.arange(60 * 784, dtype=torch.float32).view(60, 784)   # 60 flattened images
shard = samples[rank * 16:(rank + 1) * 16]          # ranks 0-2 get 16 rows, rank 3 gets 12
batch = shard.view(16, 1, 28, 28)                   # fails on rank 3
print(f"rank {rank}: batch of {batch.shape[0]}")
