"""torch.compile(model, backend="dlc"): the models PyTorch users write give
eager PyTorch's results, compiled by dlc where dlc translates their operators
and by PyTorch where it does not."""

import warnings

import numpy as np
import pytest
import torch
import torchvision

import dlc.dynamo

torch.manual_seed(0)


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


def _randomize_batchnorm(model):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


MODELS = {
    "resnet18": lambda: (torchvision.models.resnet18(), (torch.randn(2, 3, 64, 64),)),
    "mobilenet_v3_small": lambda: (torchvision.models.mobilenet_v3_small(), (torch.randn(2, 3, 64, 64),)),
    "gpt2_block": lambda: (GPT2Block(), (torch.randn(2, 16, 64),)),
    "bert_layer": lambda: (
        BertLayer(),
        (torch.randint(0, 100, (2, 12)), torch.tensor([[True] * 12, [True] * 8 + [False] * 4])),
    ),
    "lstm": lambda: (LSTM(), (torch.randn(3, 5, 16),)),
    "squeeze_excite": lambda: (SqueezeExcite(), (torch.randn(2, 8, 16, 16),)),
}


def _close(got, want, rtol=1e-4):
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rtol * max(scale, 1e-6), f"max error {err} on a scale of {scale}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_give_eager_results_compiled_by_dlc(name):
    model, inputs = MODELS[name]()
    model = _randomize_batchnorm(model).eval()
    torch._dynamo.reset()
    before = dict(dlc.dynamo.stats, left_to_pytorch=dict(dlc.dynamo.stats["left_to_pytorch"]))
    with torch.no_grad():
        want = model(*inputs)
        compiled = torch.compile(model, backend="dlc", dynamic=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # nothing left to PyTorch
            got = compiled(*inputs)
        again = compiled(*inputs)
    _close(got, want)
    assert torch.equal(got, again)
    assert dlc.dynamo.stats["compiled"] > before["compiled"]
    assert dlc.dynamo.stats["left_to_pytorch"] == before["left_to_pytorch"]


def test_operators_dlc_does_not_take_are_left_to_pytorch_with_a_warning():
    def f(x):
        y = torch.relu(x) * 2.0
        return torch.sort(y, dim=-1).values + 1.0

    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match=r"dlc: left to PyTorch: aten.sort.default x1"):
        got = torch.compile(f, backend="dlc", dynamic=False)(x)
    torch.testing.assert_close(got, f(x))


def test_each_shape_is_a_specialization_and_symbolic_shapes_go_back_to_pytorch():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    torch._dynamo.reset()
    graphs = dlc.dynamo.stats["graphs"]
    with torch.no_grad():
        c = torch.compile(m, backend="dlc", dynamic=False)
        for rows in (2, 5, 2):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(c(x), m(x))
    assert dlc.dynamo.stats["graphs"] == graphs + 2  # the third call is cached
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="symbolic shape runs in PyTorch"):
        x = torch.randn(3, 8)
        torch.testing.assert_close(torch.compile(m, backend="dlc", dynamic=True)(x), m(x))


def test_training_through_the_backend_gives_eager_gradients():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    eager = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def loss_of(params, x, y):
        w1, b1, w2, b2 = params
        h = torch.relu(x @ w1.T + b1)
        return torch.nn.functional.cross_entropy(h @ w2.T + b2, y)

    loss_of(eager, x, y).backward()
    torch._dynamo.reset()
    compiled_before = dlc.dynamo.stats["compiled"]
    loss = torch.compile(model, backend="dlc", dynamic=False)(x)
    torch.nn.functional.cross_entropy(loss, y).backward()
    for p, e in zip(model.parameters(), eager):
        torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-6)
    # The forward and the backward graph both ran dlc code.
    assert dlc.dynamo.stats["compiled"] >= compiled_before + 2


def test_the_translation_is_dlc_source(tmp_path):
    """What the backend writes for a graph is a dlc program dlc checks."""
    seen = []
    original = dlc.dynamo._compile_part

    def keep(gm):
        kernel = original(gm)
        seen.append(kernel.source)
        return kernel

    dlc.dynamo._compile_part = keep
    try:
        torch._dynamo.reset()
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).eval()
        with torch.no_grad():
            torch.compile(m, backend="dlc", dynamic=False)(torch.randn(1, 3, 8, 8))
    finally:
        dlc.dynamo._compile_part = original
    (source,) = seen
    assert source.startswith("fn graph(") and "conv2d(" in source and "relu(" in source
    path = tmp_path / "graph.dl"
    path.write_text(source)
    compiled = dlc.compile(path)
    args = [np.random.rand(*p.shape).astype(np.float32) for p in compiled.inputs]
    assert compiled(*args).shape == (1, 4, 8, 8)
