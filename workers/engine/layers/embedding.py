"""Token embedding without random initialisation.

The checkpoint fills the weight, so initialising it is wasted work, and on the meta device (where
models are built, loader.py) worse: `nn.Embedding` draws its weight with `normal_`, which there
runs torch's Python reference, and the first such call imports `torch._dynamo`, about 1.5 s of
every replica's and every parallel rank's start on a CPU core.
"""

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
