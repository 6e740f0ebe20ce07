"""The model `tilefuse demo` compiles: a small BERT-style encoder block with random weights."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class EncoderBlock(nn.Module):
    """Embedding + position, self-attention (sdpa), residual + LayerNorm, GELU MLP, residual + LayerNorm."""

    def __init__(self, vocab: int = 128, hidden: int = 64, heads: int = 4, ffn: int = 128, max_len: int = 64):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.ln0 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        pos = torch.arange(s, device=ids.device)
        x = self.ln0(self.tok(ids) + self.pos(pos))
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        keep = mask[:, None, None, :].bool()
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = self.ln1(x + self.proj(a.transpose(1, 2).reshape(b, s, -1)))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


def demo_model(seed: int = 0, batch: int = 2, seq: int = 16):
    torch.manual_seed(seed)
    model = EncoderBlock().eval()
    ids = torch.randint(0, 128, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq - 4:] = 0  # padding in the last sequence
    return model, (ids, mask)
