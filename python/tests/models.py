"""The models the torch.compile backend is tested (python/tests/test_torch.py)
and measured (scripts/bench_python.py) on: torchvision's and those written in
torch.nn, with random weights (nothing is downloaded)."""

import torch
import torchvision


class GPT2Block(torch.nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, as GPT-2 has them."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class BertLayer(torch.nn.Module):
    """A post-norm encoder layer written out: projections, scaled dot-product
    attention with a padding mask, exact GELU, dropout (identity in eval)."""

    def __init__(self, d=64, heads=4, vocab=100):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.ln1 = torch.nn.LayerNorm(d, eps=1e-12)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.ln2 = torch.nn.LayerNorm(d, eps=1e-12)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, ids, keep):
        x = self.embed(ids)
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        x = self.ln1(x + self.drop(self.out(a.transpose(1, 2).reshape(b, t, d))))
        return self.ln2(x + self.drop(self.ff(x)))


class LSTM(torch.nn.Module):
    """An LSTM over a sequence, written with torch.nn layers (Dynamo unrolls it)."""

    def __init__(self, n_in=16, hidden=32):
        super().__init__()
        self.hidden = hidden
        self.ih = torch.nn.Linear(n_in, 4 * hidden)
        self.hh = torch.nn.Linear(hidden, 4 * hidden)

    def forward(self, xs):
        h = xs.new_zeros(xs.shape[0], self.hidden)
        c = torch.zeros_like(h)
        for t in range(xs.shape[1]):
            i, f, g, o = (self.ih(xs[:, t]) + self.hh(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h


class SqueezeExcite(torch.nn.Module):
    """A user's module: a convolution stack with squeeze-excite and hardswish."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.se1 = torch.nn.Linear(16, 4)
        self.se2 = torch.nn.Linear(4, 16)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn(self.dw(self.conv(x))))
        s = torch.sigmoid(self.se2(torch.relu(self.se1(y.mean(dim=(2, 3))))))
        return torch.nn.functional.avg_pool2d(y * s[:, :, None, None], 2)


def randomize_batchnorm(model):
    """Running statistics away from 0 and 1, so that batch norm does something."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


def small_vit():
    """A two-layer vision transformer (torchvision's), its classifier drawn at
    random (torchvision starts it at zero)."""
    from torchvision.models.vision_transformer import VisionTransformer

    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)
    torch.nn.init.normal_(m.heads.head.weight, std=0.1)
    return m


# name -> a function making the model and its example inputs.
MODELS = {
    "resnet18": lambda: (torchvision.models.resnet18(), (torch.randn(2, 3, 64, 64),)),
    "mobilenet_v3_small": lambda: (torchvision.models.mobilenet_v3_small(), (torch.randn(2, 3, 64, 64),)),
    "mobilenet_v2": lambda: (torchvision.models.mobilenet_v2(), (torch.randn(1, 3, 64, 64),)),
    "efficientnet_b0": lambda: (torchvision.models.efficientnet_b0(), (torch.randn(1, 3, 64, 64),)),
    "squeezenet1_1": lambda: (torchvision.models.squeezenet1_1(), (torch.randn(1, 3, 64, 64),)),
    "shufflenet_v2_x0_5": lambda: (torchvision.models.shufflenet_v2_x0_5(), (torch.randn(1, 3, 64, 64),)),
    "vit": lambda: (small_vit(), (torch.randn(2, 3, 32, 32),)),
    "convnext_tiny": lambda: (torchvision.models.convnext_tiny(), (torch.randn(1, 3, 64, 64),)),
    "gpt2_block": lambda: (GPT2Block(), (torch.randn(2, 16, 64),)),
    "bert_layer": lambda: (
        BertLayer(),
        (torch.randint(0, 100, (2, 12)), torch.tensor([[True] * 12, [True] * 8 + [False] * 4])),
    ),
    "lstm": lambda: (LSTM(), (torch.randn(3, 5, 16),)),
    "squeeze_excite": lambda: (SqueezeExcite(), (torch.randn(2, 8, 16, 16),)),
}
