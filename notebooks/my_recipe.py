import math

import torch


def configure_optimizer(model, steps, warmup, peak):
    """AdamW with nanoGPT's two parameter groups and betas, at the learning rate `peak`, and the LambdaLR that warms it
    up over `warmup` steps, then follows a cosine down to a tenth of it at step steps - 1: (optimizer, scheduler)."""
    raise NotImplementedError
