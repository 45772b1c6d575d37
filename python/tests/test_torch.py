"""torch.compile(model, backend="dlc"): the models PyTorch users write give
eager PyTorch's results, compiled by dlc where dlc translates their operators
and by PyTorch where it does not."""

import contextlib
import warnings

import numpy as np
import pytest
import torch

import dlc.dynamo
from models import MODELS, randomize_batchnorm

torch.manual_seed(0)


@contextlib.contextmanager
def sources():
    """The dlc source of every part the backend compiles meanwhile."""
    seen = []
    original = dlc.dynamo._compile_part

    def keep(gm):
        kernel = original(gm)
        seen.append(kernel.source)
        return kernel

    dlc.dynamo._compile_part = keep
    try:
        yield seen
    finally:
        dlc.dynamo._compile_part = original


def _close(got, want, rtol=1e-4):
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rtol * max(scale, 1e-6), f"max error {err} on a scale of {scale}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_give_eager_results_compiled_by_dlc(name):
    model, inputs = MODELS[name]()
    model = randomize_batchnorm(model).eval()
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


def test_gather_and_its_gradient_are_gathers_and_scatter_adds_in_dlc():
    """torch.gather forward is dlc's gather_elements; its gradient, which
    PyTorch writes as aten.scatter_add, is scatter_add_elements: both
    compiled by dlc, nothing left to PyTorch."""
    torch.manual_seed(2)
    table = torch.randn(6, 9, requires_grad=True)
    index = torch.tensor([[0, 8, 8, 3], [1, 1, 2, 0], [7, 8, 0, 0], [5, 5, 5, 5], [4, 3, 2, 1], [0, 1, 8, 6]])

    def f(t):
        return (torch.gather(t, 1, index) ** 2).sum()

    f(table).backward()
    want = table.grad.clone()
    table.grad = None
    torch._dynamo.reset()
    with sources() as seen, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing left to PyTorch
        torch.compile(f, backend="dlc", dynamic=False)(table).backward()
    torch.testing.assert_close(table.grad, want)
    text = "\n".join(seen)
    assert "gather_elements(" in text and "scatter_add_elements(" in text, text


def test_embedding_gradients_are_scatter_adds_in_dlc():
    """An embedding's gradient (aten.index_put with accumulate, repeated ids
    adding up) is dlc's scatter_add: compiled, nothing left to PyTorch."""
    torch.manual_seed(3)
    emb = torch.nn.Embedding(20, 8)
    ids = torch.tensor([[1, 5, 5, 19], [0, 3, 1, 1]])
    eager = emb.weight.detach().clone().requires_grad_()
    torch.nn.functional.embedding(ids, eager).tanh().sum().backward()
    torch._dynamo.reset()
    with sources() as seen, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing left to PyTorch
        torch.compile(lambda i: emb(i).tanh().sum(), backend="dlc", dynamic=False)(ids).backward()
    torch.testing.assert_close(emb.weight.grad, eager.grad)
    assert "scatter_add(" in "\n".join(seen)


def test_the_translation_is_dlc_source(tmp_path):
    """What the backend writes for a graph is a dlc program dlc checks."""
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).eval()
    with torch.no_grad(), sources() as seen:
        torch.compile(m, backend="dlc", dynamic=False)(torch.randn(1, 3, 8, 8))
    (source,) = seen
    assert source.startswith("fn graph(") and "conv2d(" in source and "relu(" in source
    path = tmp_path / "graph.dl"
    path.write_text(source)
    compiled = dlc.compile(path)
    args = [np.random.rand(*p.shape).astype(np.float32) for p in compiled.inputs]
    assert compiled(*args).shape == (1, 4, 8, 8)


def test_torch_tensors_cross_without_copies():
    m = dlc.compile("fn f(x: f32[4, 8]) -> f32[4, 8] { return x * 2.0; }")
    x = torch.randn(4, 8)
    assert dlc._view(x, m.inputs[0]).address == x.data_ptr()
    (t,) = m.tensors(x)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == t.data_ptr()
    torch.testing.assert_close(y, x * 2)
    torch.testing.assert_close(torch.from_numpy(m(x.numpy())), x * 2)
    with pytest.raises(TypeError, match=r"input `x`.*not C-contiguous"):
        m(torch.randn(8, 4).T)
    with pytest.raises(TypeError, match=r"input `x`: Tensor.__dlpack__\(\) failed"):
        m(torch.randn(4, 8, requires_grad=True))


def test_parameters_changed_in_place_are_read_at_each_call():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
    x = torch.randn(3, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        c = torch.compile(m, backend="dlc", dynamic=False)
        torch.testing.assert_close(c(x), m(x))
        m[0].weight.mul_(-2.0)  # an optimizer's step: same memory, new values
        torch.testing.assert_close(c(x), m(x))
        m[0].bias = torch.nn.Parameter(torch.randn(4))  # new memory
        torch.testing.assert_close(c(x), m(x))


def test_training_mode_layers_take_their_statistics_from_the_batch():
    """Batch norm in training mode (batch statistics, running averages
    updated) and layer norm's saved statistics run as dlc code; the gradients
    and the running averages are eager's."""

    def make():
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.LayerNorm(8 * 6 * 6),
            torch.nn.Linear(8 * 6 * 6, 5),
        ).train()

    x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 5, (4,))
    eager, model = make(), make()
    torch.nn.functional.cross_entropy(eager(x), y).backward()
    torch._dynamo.reset()
    dlc.dynamo.stats["left_to_pytorch"].clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the convolution's backward stays in PyTorch
        torch.nn.functional.cross_entropy(torch.compile(model, backend="dlc", dynamic=False)(x), y).backward()
    left = dlc.dynamo.stats["left_to_pytorch"]
    assert not any("batch_norm" in k or "layer_norm" in k for k in left), left
    for (name, p), e in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean)
    torch.testing.assert_close(model[1].running_var, eager[1].running_var)


@pytest.mark.parametrize("index", [(slice(None), slice(None, None, 2)), (slice(1, None, 3),), (slice(None), slice(1, 7, 2)), (slice(None), slice(3, None, 4))])
def test_strided_slices(index):
    def f(x):
        return x[index] * 2.0

    x = torch.randn(10, 9)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # compiled by dlc, nothing left
        got = torch.compile(f, backend="dlc", dynamic=False)(x)
    torch.testing.assert_close(got, f(x))


def test_dilated_convolutions_are_the_built_ins():
    class WaveNetish(torch.nn.Module):
        """Causal dilated 1-D convolutions (WaveNet's stack), a dilated 2-D
        one and a dilated depthwise one (DeepLab's atrous blocks)."""

        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(torch.nn.Conv1d(8, 8, 2, dilation=d) for d in (1, 2, 4))
            self.conv2d = torch.nn.Conv2d(3, 4, 3, padding=2, dilation=2, stride=(1, 2))
            self.depthwise = torch.nn.Conv2d(4, 4, 5, padding=4, dilation=2, groups=4)

        def forward(self, x, img):
            for conv in self.convs:
                x = x[:, :, -conv(x).shape[-1]:] + torch.tanh(conv(x))
            return x, self.depthwise(self.conv2d(img))

    m = WaveNetish().eval()
    inputs = (torch.randn(2, 8, 20), torch.randn(1, 3, 9, 11))
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings(), sources() as seen:
        warnings.simplefilter("error", RuntimeWarning)
        got = torch.compile(m, backend="dlc", dynamic=False)(*inputs)
        want = m(*inputs)
    for g, e in zip(got, want):
        _close(g, e)
    # Four dilated convolutions (two 1-D, two 2-D) are the built-ins: no
    # operator in index notation.
    assert not any("\nop " in src or src.startswith("op ") for src in seen)
    written = "".join(seen)
    for d in ("dilation=2)", "dilation=4)", "dilation=[2, 2])"):
        assert d in written, d


@pytest.mark.parametrize("stride, dilation, groups", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 1, 4), (1, 2, 4), (2, 2, 1)])
def test_convolution_gradients_come_from_dlcs_reverse_mode(stride, dilation, groups):
    """`convolution_backward` is written as dlc's `value_and_grad` of the
    convolution; the input's, weight's and bias's gradients are eager's."""

    def make():
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(4, 8, 3, stride=stride, padding=1, dilation=dilation, groups=groups)
        return torch.nn.Sequential(conv, torch.nn.Tanh(), torch.nn.Flatten())

    model, eager = make(), make()
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    torch._dynamo.reset()
    with warnings.catch_warnings(), sources() as seen:
        warnings.simplefilter("error", RuntimeWarning)  # nothing left to PyTorch
        torch.compile(model, backend="dlc", dynamic=False)(x).pow(2).sum().backward()
    eager(xe).pow(2).sum().backward()
    assert any("value_and_grad(vjp0(" in src for src in seen)
    for got, want in [(x.grad, xe.grad)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]:
        _close(got, want)


def test_3d_convolutions_are_the_built_in_and_differentiate():
    """Video convolutions (R3D's, strided in time; a grouped one dilated
    in time whose outer taps meet the clip from some frames only) are the
    built-in `conv3d`; their outputs and the gradients of the input and
    every parameter are eager's."""

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv3d(3, 8, 3, stride=(2, 1, 2), padding=1),
            torch.nn.Tanh(),
            torch.nn.Conv3d(8, 8, (3, 3, 1), padding=(2, 1, 0), dilation=(2, 1, 1), groups=2),
            torch.nn.Flatten(),
        )

    model, eager = make(), make()
    x = torch.randn(2, 3, 5, 6, 7, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    torch._dynamo.reset()
    with warnings.catch_warnings(), sources() as seen:
        warnings.simplefilter("error", RuntimeWarning)  # nothing left to PyTorch
        got = torch.compile(model, backend="dlc", dynamic=False)(x)
        got.pow(2).sum().backward()
    want = eager(xe)
    want.pow(2).sum().backward()
    _close(got.detach(), want.detach())
    written = "".join(seen)
    assert "conv3d(" in written and "stride=[2, 1, 2]" in written and "dilation=[2, 1, 1]" in written
    assert not any("\nop " in src or src.startswith("op ") for src in seen)
    for g, e in [(x.grad, xe.grad)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]:
        _close(g, e)


@pytest.mark.parametrize("size, kernel, stride, padding", [(13, 3, 2, 0), (14, 3, 2, 1), (10, 2, 2, 0), (9, 3, 3, 1)])
def test_max_pooling_in_ceil_mode(size, kernel, stride, padding):
    pool = torch.nn.MaxPool2d(kernel, stride, padding=padding, ceil_mode=True)
    x = torch.randn(2, 3, size, size)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = torch.compile(lambda t: pool(t) * 1.0, backend="dlc", dynamic=False)(x)
    torch.testing.assert_close(got, pool(x))


def test_strided_views_that_are_reshapes_compile_and_others_are_left():
    def reshape_view(x):
        return x.exp().as_strided((4, 6), (6, 1)) * 2.0

    def windows(x):
        return x.exp().as_strided((3, 4), (2, 1)) * 2.0  # overlapping windows

    x = torch.randn(2, 12)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        torch.testing.assert_close(torch.compile(reshape_view, backend="dlc", dynamic=False)(x), reshape_view(x))
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match="as_strided.default x1 \\(a strided view that is not a reshape\\)"):
        torch.testing.assert_close(torch.compile(windows, backend="dlc", dynamic=False)(x), windows(x))


def test_a_part_dlc_fails_to_compile_runs_in_pytorch(monkeypatch):
    def refuse(gm):
        raise dlc.CompileError("error: this part does not compile\nmore lines")

    monkeypatch.setattr(dlc.dynamo, "_compile_part", refuse)
    f = lambda x: torch.tanh(x) * 3.0  # noqa: E731
    x = torch.randn(5)
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match="a part of 2 operators runs in PyTorch: error: this part does not compile$"):
        got = torch.compile(f, backend="dlc", dynamic=False)(x)
    torch.testing.assert_close(got, f(x))
