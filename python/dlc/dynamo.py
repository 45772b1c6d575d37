"""dlc as a ``torch.compile`` backend: ``torch.compile(model, backend="dlc")``.

The package registers :func:`backend` under the ``torch_dynamo_backends`` entry
point, so the name works after ``pip install``. Dynamo captures an FX graph;
AOTAutograd lowers it to PyTorch's core ATen operators (with
``core_aten_decompositions``), lifting parameters to inputs, and hands the forward
graph (and, when gradients are needed, the backward graph) to :func:`compile_graph`.
That splits the graph around the operators dlc does not translate, writes each
supported part as a dlc function (one ``let`` per ATen node), compiles it with
``dlc.compile`` and calls it on the tensors' own memory. What it cannot take runs in
PyTorch, with one warning naming the operators; nothing it cannot compile stops the
user's program.

Shapes: graphs with symbolic shapes are handed back to PyTorch whole (with a
warning). ``torch.compile(model, backend="dlc", dynamic=False)`` makes Dynamo
specialize every new input shape instead, and each specialization is compiled and
cached by Dynamo.
"""

from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _dlc
from . import compile as dlc_compile

__all__ = ["backend", "compile_graph", "stats"]

aten = torch.ops.aten

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
}
_FLOATS = ("f32", "f64", "f16", "bf16")

stats: Dict[str, Any] = {"graphs": 0, "compiled": 0, "ops": 0, "left_to_pytorch": {}}
"""What the backend did since the process started: graphs it was handed, parts it
compiled with dlc, ATen nodes in them, and the operators (with counts) it left to
PyTorch."""


class Unsupported(Exception):
    """A node dlc does not translate (the reason is the message)."""


class Val:
    """A tensor value of the dlc function being written: its name, dlc type and shape."""

    __slots__ = ("name", "dtype", "shape")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...]):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)

    def __str__(self) -> str:
        return self.name


def _type(t: Any) -> Tuple[str, Tuple[int, ...]]:
    """The dlc element type and static shape of a (fake) tensor, or Unsupported."""
    if isinstance(t, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported("a symbolic shape")
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"a {type(t).__name__} value")
    if t.dtype not in _DTYPES:
        raise Unsupported(f"element type {t.dtype}")
    if t.device.type != "cpu":
        raise Unsupported(f"a tensor on {t.device}")
    shape = []
    for d in t.shape:
        if not isinstance(d, int):
            raise Unsupported("a symbolic shape")
        if d == 0:
            raise Unsupported("an empty tensor")
        shape.append(d)
    return _DTYPES[t.dtype], tuple(shape)


def _tensor_type(dtype: str, shape: Sequence[int]) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def _lit(v: Any, dtype: str) -> str:
    """A Python number as a dlc literal of `dtype` (bool: true/false)."""
    if dtype == "bool":
        return "true" if v else "false"
    if dtype in _FLOATS:
        v = float(v)
        if math.isnan(v) or math.isinf(v):
            word = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return f"tensor([{word}], [], dtype={dtype})"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"({text})" if v < 0 else text
    if isinstance(v, float) and not v.is_integer():
        raise Unsupported(f"the float {v} with integers")
    v = int(v)
    return f"({v})" if v < 0 else str(v)


def _list(xs: Sequence[Any]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


class _Writer:
    """Writes one dlc function from an FX graph of ATen nodes."""

    def __init__(self) -> None:
        self.lines: List[str] = []
        self.count = 0
        # User operators (index notation) and helper functions the function
        # calls, written before it.
        self.ops: List[str] = []
        self.fns: List[str] = []

    def op(self, params: str, result: str, body: str) -> str:
        """Defines an operator in index notation; returns its name."""
        name = f"op{len(self.ops)}"
        self.ops.append(f"op {name}({params}) -> {result} {{\n    {body}\n}}\n")
        return name

    def let(self, expr: str, dtype: str, shape: Sequence[int]) -> Val:
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"    let {name} = {expr};")
        return Val(name, dtype, shape)

    def cast(self, x: Any, dtype: str) -> str:
        """`x` (a Val or a Python number) as an expression of `dtype`."""
        if isinstance(x, Val):
            return x.name if x.dtype == dtype else f"cast({x.name}, {dtype})"
        return _lit(x, dtype)


# ---------------------------------------------------------------- translations

_Handler = Callable[..., Any]
_HANDLERS: Dict[Any, _Handler] = {}
# Operators that only move or view data: a part made of these alone is left to
# PyTorch, whose views cost nothing.
_LAYOUT_ONLY = set()


def _handles(*ops: Any, layout: bool = False) -> Callable[[_Handler], _Handler]:
    def register(f: _Handler) -> _Handler:
        for op in ops:
            _HANDLERS[op] = f
            if layout:
                _LAYOUT_ONLY.add(op)
        return f

    return register


def _out(node: Any) -> Tuple[str, Tuple[int, ...]]:
    return _type(node.meta["val"])


def _binary(symbol: str) -> _Handler:
    def h(w: _Writer, node: Any, a: Any, b: Any, **kw: Any) -> Val:
        dtype, shape = _out(node)
        return w.let(f"{w.cast(a, dtype)} {symbol} {w.cast(b, dtype)}", dtype, shape)

    return h


for _op, _sym in [
    (aten.mul.Tensor, "*"),
    (aten.mul.Scalar, "*"),
    (aten.div.Tensor, "/"),
    (aten.div.Scalar, "/"),
]:
    _handles(_op)(_binary(_sym))


@_handles(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add(w: _Writer, node: Any, a: Any, b: Any, alpha: Any = 1) -> Val:
    dtype, shape = _out(node)
    rhs = w.cast(b, dtype)
    if alpha != 1:
        rhs = f"{rhs} * {_lit(alpha, dtype)}"
    sign = "-" if node.target in (aten.sub.Tensor, aten.sub.Scalar) else "+"
    return w.let(f"{w.cast(a, dtype)} {sign} {rhs}", dtype, shape)


@_handles(aten.rsub.Scalar)
def _rsub(w: _Writer, node: Any, a: Any, b: Any, alpha: Any = 1) -> Val:
    dtype, shape = _out(node)
    return w.let(f"{_lit(b, dtype)} - {w.cast(a, dtype)} * {_lit(alpha, dtype)}", dtype, shape)


def _common(a: Any, b: Any) -> str:
    """The type both operands of a comparison are brought to (PyTorch's promotion)."""
    ta = a.dtype if isinstance(a, Val) else None
    tb = b.dtype if isinstance(b, Val) else None
    if ta and tb:
        inv = {v: k for k, v in _DTYPES.items()}
        return _DTYPES[torch.promote_types(inv[ta], inv[tb])]
    t = ta or tb
    other = b if ta else a
    if t not in _FLOATS and isinstance(other, float):
        return "f32"
    return t


def _compare(symbol: str) -> _Handler:
    def h(w: _Writer, node: Any, a: Any, b: Any) -> Val:
        dtype, shape = _out(node)
        t = _common(a, b)
        return w.let(f"{w.cast(a, t)} {symbol} {w.cast(b, t)}", dtype, shape)

    return h


for _name, _sym in [("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")]:
    _op = getattr(aten, _name)
    _handles(_op.Tensor, _op.Scalar)(_compare(_sym))


def _call(fn: str, *, floats: bool = False) -> _Handler:
    def h(w: _Writer, node: Any, *args: Any) -> Val:
        dtype, shape = _out(node)
        if floats and dtype not in _FLOATS:
            raise Unsupported(f"{fn} of {dtype}")
        return w.let(f"{fn}({', '.join(w.cast(a, dtype) for a in args)})", dtype, shape)

    return h


for _fn, _ops, _floats in [
    ("relu", [aten.relu.default], False),
    ("exp", [aten.exp.default], True),
    ("log", [aten.log.default], True),
    ("sqrt", [aten.sqrt.default], True),
    ("rsqrt", [aten.rsqrt.default], True),
    ("tanh", [aten.tanh.default], True),
    ("sigmoid", [aten.sigmoid.default], True),
    ("abs", [aten.abs.default], False),
    ("floor", [aten.floor.default], True),
    ("ceil", [aten.ceil.default], True),
    ("round", [aten.round.default], True),
    ("sign", [aten.sign.default], False),
    ("reciprocal", [aten.reciprocal.default], True),
    ("sin", [aten.sin.default], True),
    ("cos", [aten.cos.default], True),
    ("erf", [aten.erf.default], True),
    ("log1p", [aten.log1p.default], True),
    ("expm1", [aten.expm1.default], True),
    ("max", [aten.maximum.default], False),
    ("min", [aten.minimum.default], False),
    ("pow", [aten.pow.Tensor_Tensor], True),
    ("logical_and", [aten.logical_and.default], False),
    ("logical_or", [aten.logical_or.default], False),
    ("logical_xor", [aten.logical_xor.default], False),
]:
    _handles(*_ops)(_call(_fn, floats=_floats))


@_handles(aten.logical_not.default)
def _logical_not(w: _Writer, node: Any, x: Val) -> Val:
    dtype, shape = _out(node)
    return w.let(f"logical_not({w.cast(x, 'bool')})", dtype, shape)


@_handles(aten.bitwise_not.default)
def _bitwise_not(w: _Writer, node: Any, x: Val) -> Val:
    dtype, shape = _out(node)
    if dtype == "bool":
        return w.let(f"logical_not({x})", dtype, shape)
    if dtype.startswith("u"):
        raise Unsupported(f"bitwise not of {dtype}")
    return w.let(f"bitxor({x}, {_lit(-1, dtype)})", dtype, shape)


def _bitwise(logical: str, bitwise: str) -> _Handler:
    def h(w: _Writer, node: Any, a: Any, b: Any) -> Val:
        dtype, shape = _out(node)
        fn = logical if dtype == "bool" else bitwise
        return w.let(f"{fn}({w.cast(a, dtype)}, {w.cast(b, dtype)})", dtype, shape)

    return h


for _name, _logical, _bit in [("and", "logical_and", "bitand"), ("or", "logical_or", "bitor"), ("xor", "logical_xor", "bitxor")]:
    _op = getattr(aten, f"bitwise_{_name}")
    _handles(_op.Tensor, _op.Scalar)(_bitwise(_logical, _bit))


@_handles(aten.neg.default)
def _neg(w: _Writer, node: Any, x: Val) -> Val:
    dtype, shape = _out(node)
    return w.let(f"-{x.name}", dtype, shape)


@_handles(aten.pow.Tensor_Scalar)
def _pow(w: _Writer, node: Any, x: Val, e: Any) -> Val:
    dtype, shape = _out(node)
    if dtype not in _FLOATS:
        raise Unsupported(f"pow of {dtype}")
    x = w.cast(x, dtype)
    if e == 2:
        return w.let(f"{x} * {x}", dtype, shape)
    if e == 0.5:
        return w.let(f"sqrt({x})", dtype, shape)
    return w.let(f"pow({x}, {_lit(e, dtype)})", dtype, shape)


@_handles(aten.gelu.default)
def _gelu(w: _Writer, node: Any, x: Val, approximate: str = "none") -> Val:
    dtype, shape = _out(node)
    if approximate == "tanh":
        return w.let(f"gelu({x})", dtype, shape)
    return w.let(f"{x} * 0.5 * (erf({x} * 0.7071067811865476) + 1.0)", dtype, shape)


@_handles(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default)
def _clamp(w: _Writer, node: Any, x: Val, lo: Any = None, hi: Any = None) -> Val:
    dtype, shape = _out(node)
    if node.target == aten.clamp_max.default:
        lo, hi = None, lo
    if node.target == aten.hardtanh.default:
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    bounds = []
    if lo is not None:
        bounds.append(f"min={_lit(lo, dtype)}")
    if hi is not None:
        bounds.append(f"max={_lit(hi, dtype)}")
    if not bounds:
        return x
    return w.let(f"clamp({w.cast(x, dtype)}, {', '.join(bounds)})", dtype, shape)


@_handles(aten.where.self)
def _where(w: _Writer, node: Any, c: Val, a: Any, b: Any) -> Val:
    dtype, shape = _out(node)
    return w.let(f"where({w.cast(c, 'bool')}, {w.cast(a, dtype)}, {w.cast(b, dtype)})", dtype, shape)


@_handles(aten.threshold_backward.default)
def _threshold_backward(w: _Writer, node: Any, grad: Val, x: Val, threshold: Any) -> Val:
    dtype, shape = _out(node)
    return w.let(
        f"where({x.name} <= {_lit(threshold, x.dtype)}, {_lit(0, dtype)}, {w.cast(grad, dtype)})",
        dtype,
        shape,
    )


def _axes(dims: Any, rank: int) -> List[int]:
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank if rank else 0 for d in dims] or list(range(rank))


def _reduce(fn: str) -> _Handler:
    def h(w: _Writer, node: Any, x: Val, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Val:
        out, shape = _out(node)
        if not x.shape:
            return w.let(w.cast(x, out), out, shape)
        axes = _axes(dim, len(x.shape))
        keep = "true" if keepdim else "false"
        return w.let(f"{fn}({w.cast(x, out)}, axis={_list(axes)}, keepdims={keep})", out, shape)

    return h


_handles(aten.sum.dim_IntList, aten.sum.default)(_reduce("sum"))
_handles(aten.mean.dim, aten.mean.default)(_reduce("mean"))
_handles(aten.amax.default)(_reduce("max"))
_handles(aten.amin.default)(_reduce("min"))
_handles(aten.prod.dim_int, aten.prod.default)(_reduce("prod"))


@_handles(aten.any.dim, aten.any.dims, aten.any.default)
def _any(w: _Writer, node: Any, x: Val, dim: Any = None, keepdim: bool = False) -> Val:
    dtype, shape = _out(node)
    axes = _axes(dim, len(x.shape))
    keep = "true" if keepdim else "false"
    return w.let(f"sum(cast({w.cast(x, 'bool')}, i32), axis={_list(axes)}, keepdims={keep}) > 0", dtype, shape)


@_handles(aten.var.correction)
def _var(w: _Writer, node: Any, x: Val, dim: Any = None, *, correction: Any = 1, keepdim: bool = False) -> Val:
    dtype, shape = _out(node)
    axes = _axes(dim, len(x.shape))
    n = math.prod(x.shape[a] for a in axes)
    c = 1 if correction is None else correction
    if n - c <= 0:
        raise Unsupported("a variance of too few elements")
    keep = "true" if keepdim else "false"
    scale = _lit(n / (n - c), dtype)
    return w.let(f"variance({x}, axis={_list(axes)}, keepdims={keep}) * {scale}", dtype, shape)


@_handles(aten._softmax.default, aten._log_softmax.default)
def _softmax(w: _Writer, node: Any, x: Val, dim: int, half_to_float: bool = False) -> Val:
    dtype, shape = _out(node)
    fn = "softmax" if node.target == aten._softmax.default else "log_softmax"
    return w.let(f"{fn}({w.cast(x, dtype)}, axis={dim % len(x.shape)})", dtype, shape)


def _used_results(node: Any) -> set:
    return {u.args[1] for u in node.users if u.target is operator.getitem}


@_handles(aten.native_layer_norm.default)
def _layer_norm(w: _Writer, node: Any, x: Val, normalized: Sequence[int], weight: Any, bias: Any, eps: float) -> list:
    used = _used_results(node)
    dtype, shape = _type(node.meta["val"][0])
    rank = len(x.shape)
    axes = _list(range(rank - len(normalized), rank))
    e = _lit(eps, "f32")
    expr = f"layernorm({x}, axis={axes}, eps={e})"
    if weight is not None:
        expr = f"{expr} * {weight}"
    if bias is not None:
        expr = f"{expr} + {bias}"
    results: List[Optional[Val]] = [w.let(expr, dtype, shape) if 0 in used or not used else None]
    # The statistics a backward pass reads: the mean and 1/sqrt(var + eps),
    # kept as dimensions of extent 1.
    for i, stat in ((1, f"mean({x}, axis={axes}, keepdims=true)"), (2, f"rsqrt(variance({x}, axis={axes}, keepdims=true) + {e})")):
        if i in used:
            sdtype, sshape = _type(node.meta["val"][i])
            results.append(w.let(f"reshape({stat}, {_list(sshape)})", sdtype, sshape))
        else:
            results.append(None)
    return results


@_handles(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(w: _Writer, node: Any, x: Val, weight: Any, bias: Any, mean: Val, var: Val, momentum: float, eps: float) -> list:
    if _used_results(node) - {0}:
        raise Unsupported("batch norm's statistics as results")
    dtype, shape = _type(node.meta["val"][0])
    c = x.shape[1]
    gamma = weight.name if weight is not None else f"ones([{c}], dtype={dtype})"
    beta = bias.name if bias is not None else f"zeros([{c}], dtype={dtype})"
    expr = f"batchnorm({x}, {mean}, {var}, {gamma}, {beta}, eps={_lit(eps, 'f32')})"
    return [w.let(expr, dtype, shape), None, None]


@_handles(aten._native_batch_norm_legit_functional.default)
def _batch_norm_training(w: _Writer, node: Any, x: Val, weight: Any, bias: Any, running_mean: Val, running_var: Val, training: bool, momentum: float, eps: float) -> list:
    """Batch statistics: (result, mean, 1/sqrt(var + eps), new running mean,
    new running variance), as PyTorch's training mode computes them (the
    running variance takes the unbiased variance)."""
    if not training:
        raise Unsupported("a functional batch norm outside training")
    dtype, shape = _type(node.meta["val"][0])
    if dtype not in ("f32", "f64") or any(_type(v)[0] != dtype for v in node.meta["val"]):
        raise Unsupported(f"batch statistics of {dtype} with statistics of other types")
    c = x.shape[1]
    axes = [a for a in range(len(x.shape)) if a != 1]
    n = math.prod(x.shape[a] for a in axes)
    stat_shape = [1, c] + [1] * (len(x.shape) - 2)
    mean = w.let(f"mean({x}, axis={_list(axes)}, keepdims=true)", dtype, stat_shape)
    var = w.let(f"variance({x}, axis={_list(axes)}, keepdims=true)", dtype, stat_shape)
    invstd = w.let(f"rsqrt({var} + {_lit(eps, dtype)})", dtype, stat_shape)
    expr = f"({x} - {mean}) * {invstd}"
    if weight is not None:
        expr = f"{expr} * reshape({weight}, {_list(stat_shape)})"
    if bias is not None:
        expr = f"{expr} + reshape({bias}, {_list(stat_shape)})"
    out = w.let(expr, dtype, shape)
    flat_mean = w.let(f"reshape({mean}, [{c}])", dtype, [c])
    flat_invstd = w.let(f"reshape({invstd}, [{c}])", dtype, [c])
    m = _lit(momentum, dtype)
    keep = _lit(1.0 - momentum, dtype)
    unbiased = _lit(n / max(n - 1, 1), dtype)
    new_mean = w.let(f"{running_mean} * {keep} + {flat_mean} * {m}", dtype, [c])
    new_var = w.let(f"{running_var} * {keep} + reshape({var}, [{c}]) * {unbiased} * {m}", dtype, [c])
    return [out, flat_mean, flat_invstd, new_mean, new_var]


def _conv_expr(w: _Writer, x: Val, weight: Val, out: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, groups: int) -> str:
    """The convolution of `x` by `weight` (result shape `out`) as the
    built-in `conv1d`/`conv2d`/`conv3d`, dilated or not."""
    rank = len(x.shape)
    if transposed:
        raise Unsupported("a transposed convolution")
    if rank not in (3, 4, 5):
        raise Unsupported(f"a convolution of rank {rank}")
    fn = f"conv{rank - 2}d"
    s = _list(stride) if rank > 3 else stride[0]
    p = _list(padding) if rank > 3 else padding[0]
    d = _list(dilation) if rank > 3 else dilation[0]
    return f"{fn}({x}, {weight}, stride={s}, padding={p}, groups={groups}, dilation={d})"


def _bias_shape(out: Sequence[int]) -> str:
    return _list([1, out[1]] + [1] * (len(out) - 2))


@_handles(aten.convolution.default)
def _convolution(w: _Writer, node: Any, x: Val, weight: Val, bias: Any, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Val:
    dtype, shape = _out(node)
    expr = _conv_expr(w, x, weight, shape, stride, padding, dilation, transposed, groups)
    if bias is not None:
        expr = f"{expr} + reshape({bias}, {_bias_shape(shape)})"
    return w.let(expr, dtype, shape)


@_handles(aten.convolution_backward.default)
def _convolution_backward(w: _Writer, node: Any, grad: Val, x: Val, weight: Val, bias_sizes: Any, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]) -> list:
    """The input's and the weight's gradients from dlc's own reverse mode:
    they are the gradient of `sum(conv(x, w) * grad)` with respect to `x`
    and `w`, a `value_and_grad` of a helper function; the bias's is the
    sum of `grad` over every axis but the channels'."""
    used = _used_results(node)
    wrt = [name for i, name in ((0, "x"), (1, "w")) if output_mask[i] and i in used]
    results: List[Optional[Val]] = [None, None, None]
    if wrt:
        # A dimension parameter (the batch) makes the helper generic, so it
        # is no entry point of its own.
        xt = "f32[N, " + ", ".join(map(str, x.shape[1:])) + "]" if x.dtype == "f32" else None
        if xt is None:
            raise Unsupported(f"a convolution's gradient in {x.dtype}")
        gt = "f32[N, " + ", ".join(map(str, grad.shape[1:])) + "]"
        inner = _Writer()
        inner.ops = w.ops  # operators it defines go before every function
        xv = Val("x", x.dtype, x.shape)
        wv = Val("w", weight.dtype, weight.shape)
        conv = _conv_expr(inner, xv, wv, grad.shape, stride, padding, dilation, transposed, groups)
        helper = f"vjp{len(w.fns)}"
        w.fns.append(
            f"fn {helper}[N](x: {xt}, w: {_tensor_type(weight.dtype, weight.shape)}, g: {gt}) -> f32 {{\n"
            f"    return sum({conv} * g);\n}}\n"
        )
        names = [f"v{w.count}_{k}" for k in ("value", *wrt)]
        w.count += 1
        args = {"x": x.name, "w": weight.name}
        if len({x.name, weight.name, grad.name}) < 3:
            raise Unsupported("a convolution's gradient of one tensor by itself")
        w.lines.append(
            f"    let ({', '.join(names)}) = "
            f"value_and_grad({helper}({x}, {weight}, {grad}), wrt=[{', '.join(args[k] for k in wrt)}]);"
        )
        for k, name in zip(wrt, names[1:]):
            i = 0 if k == "x" else 1
            results[i] = Val(name, *_type(node.meta["val"][i]))
    if output_mask[2] and 2 in used:
        axes = [a for a in range(len(grad.shape)) if a != 1]
        results[2] = w.let(f"sum({grad}, axis={_list(axes)})", *_type(node.meta["val"][2]))
    return results


@_handles(aten.max_pool2d_with_indices.default)
def _max_pool(w: _Writer, node: Any, x: Val, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> list:
    if _used_results(node) - {0}:
        raise Unsupported("max pooling's indices")
    if any(d != 1 for d in _pair(dilation)):
        raise Unsupported("max pooling with dilation")
    dtype, shape = _type(node.meta["val"][0])
    kernel, stride, padding = _pair(kernel), _pair(list(stride) or list(kernel)), _pair(padding)
    source = x.name
    if ceil_mode:
        # The last windows reach past the input: it is extended below and to
        # the right by values no element is smaller than (windows start
        # inside the input, so none is made of them alone).
        if dtype not in ("f32", "f64"):
            raise Unsupported(f"max pooling with ceil mode on {dtype}")
        extra = [
            max(0, (o - 1) * s + k - (n + 2 * p))
            for o, s, k, n, p in zip(shape[-2:], stride, kernel, x.shape[-2:], padding)
        ]
        if any(extra):
            lowest = _lit(float(torch.finfo(torch.float32 if dtype == "f32" else torch.float64).min), dtype)
            pads = [0, 0] * (len(x.shape) - 2) + [0, extra[0], 0, extra[1]]
            source = f"pad({x}, {_list(pads)}, value={lowest})"
    expr = f"maxpool2d({source}, kernel={_list(kernel)}, stride={_list(stride)}, padding={_list(padding)})"
    return [w.let(expr, dtype, shape), None]


@_handles(aten.avg_pool2d.default)
def _avg_pool(w: _Writer, node: Any, x: Val, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Val:
    if ceil_mode or divisor_override is not None or (not count_include_pad and any(_pair(padding))):
        raise Unsupported("average pooling with ceil mode, a divisor or padding left out of the average")
    dtype, shape = _out(node)
    stride = list(stride) or list(kernel)
    expr = f"avgpool2d({x}, kernel={_list(_pair(kernel))}, stride={_list(_pair(stride))}, padding={_list(_pair(padding))})"
    return w.let(expr, dtype, shape)


@_handles(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool(w: _Writer, node: Any, x: Val, size: Sequence[int]) -> Val:
    dtype, shape = _out(node)
    h, wd = x.shape[-2:]
    oh, ow = _pair(size)
    if h % oh or wd % ow:
        raise Unsupported("adaptive pooling to a size that does not divide the input")
    k = [h // oh, wd // ow]
    return w.let(f"avgpool2d({x}, kernel={_list(k)}, stride={_list(k)})", dtype, shape)


def _pair(v: Any) -> List[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v


@_handles(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.flatten.using_ints,
    layout=True,
)
def _reshape(w: _Writer, node: Any, x: Val, *args: Any) -> Val:
    dtype, shape = _out(node)
    if tuple(shape) == x.shape:
        return x
    return w.let(f"reshape({x}, {_list(shape)})", dtype, shape)


@_handles(aten.as_strided.default, layout=True)
def _as_strided(w: _Writer, node: Any, x: Val, size: Sequence[int], stride: Sequence[int], storage_offset: Any = 0) -> Val:
    """A view of `x`'s elements in row-major order (every dlc value is) as
    `size`: translated where that is a reshape, that is, where the strides are
    `size`'s row-major ones (those of extents of one aside) and every element
    is seen once."""
    dtype, shape = _out(node)
    expected = 1
    for n, s in reversed(list(zip(size, stride))):
        if n != 1 and s != expected:
            raise Unsupported("a strided view that is not a reshape")
        expected *= n
    if (storage_offset or 0) != 0 or math.prod(size) != math.prod(x.shape):
        raise Unsupported("a strided view of part of a tensor")
    if tuple(shape) == x.shape:
        return x
    return w.let(f"reshape({x}, {_list(shape)})", dtype, shape)


@_handles(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, layout=True)
def _identity(w: _Writer, node: Any, x: Val, **kw: Any) -> Val:
    return x


@_handles(aten._to_copy.default, aten.to.dtype)
def _to_copy(w: _Writer, node: Any, x: Val, *args: Any, **kw: Any) -> Val:
    dtype, shape = _out(node)
    if dtype == x.dtype:
        return x
    return w.let(f"cast({x}, {dtype})", dtype, shape)


@_handles(aten.permute.default, layout=True)
def _permute(w: _Writer, node: Any, x: Val, dims: Sequence[int]) -> Val:
    dtype, shape = _out(node)
    dims = [d % len(x.shape) for d in dims]
    if dims == sorted(dims):
        return x
    return w.let(f"transpose({x}, {_list(dims)})", dtype, shape)


@_handles(aten.t.default, layout=True)
def _t(w: _Writer, node: Any, x: Val) -> Val:
    dtype, shape = _out(node)
    if len(x.shape) < 2:
        return x
    return w.let(f"transpose({x}, [1, 0])", dtype, shape)


@_handles(aten.transpose.int, layout=True)
def _transpose(w: _Writer, node: Any, x: Val, d0: int, d1: int) -> Val:
    dtype, shape = _out(node)
    perm = list(range(len(x.shape)))
    d0, d1 = d0 % len(perm), d1 % len(perm)
    if d0 == d1:
        return x
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return w.let(f"transpose({x}, {_list(perm)})", dtype, shape)


@_handles(aten.expand.default, layout=True)
def _expand(w: _Writer, node: Any, x: Val, size: Sequence[int], **kw: Any) -> Val:
    dtype, shape = _out(node)
    if tuple(shape) == x.shape:
        return x
    return w.let(f"broadcast({x}, {_list(shape)})", dtype, shape)


@_handles(aten.cat.default)
def _cat(w: _Writer, node: Any, xs: Sequence[Val], dim: int = 0) -> Val:
    dtype, shape = _out(node)
    parts = [w.cast(x, dtype) for x in xs]
    if len(parts) == 1:
        return w.let(parts[0], dtype, shape)
    return w.let(f"concat({_list(parts)}, axis={dim % len(shape)})", dtype, shape)


def _slice_expr(x: Val, dim: int, start: int, end: int) -> str:
    return f"slice({x}, axis={dim}, start={start}, end={end})"


@_handles(aten.slice.Tensor, layout=True)
def _slice(w: _Writer, node: Any, x: Val, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Val:
    dtype, shape = _out(node)
    dim %= len(x.shape)
    n = x.shape[dim]
    start, end, _ = slice(start, end).indices(n)
    if end <= start:
        raise Unsupported("an empty slice")
    if step == 1:
        if start == 0 and end == n:
            return x
        return w.let(_slice_expr(x, dim, start, end), dtype, shape)
    # Every step-th element: the run from `start` cut into rows of `step`
    # (the last row may reach past the end when it is still inside the
    # axis), of which the first column is kept.
    count = shape[dim]
    stop = start + count * step
    if stop > n:
        if start + (count - 1) * step + 1 > n:
            raise Unsupported("a strided slice")
        stop = start + (count - 1) * step
        head = _slice_expr(x, dim, start, stop) if stop > start else None
        # The last element alone, after the whole rows.
        last = _slice_expr(x, dim, stop, stop + 1)
        rows = list(x.shape[:dim]) + [count - 1, step] + list(x.shape[dim + 1 :])
        parts = []
        if head is not None:
            parts.append(f"reshape(slice(reshape({head}, {_list(rows)}), axis={dim + 1}, start=0, end=1), {_list(list(shape[:dim]) + [count - 1] + list(shape[dim + 1:]))})")
        parts.append(last)
        expr = parts[0] if len(parts) == 1 else f"concat({_list(parts)}, axis={dim})"
        return w.let(expr, dtype, shape)
    rows = list(x.shape[:dim]) + [count, step] + list(x.shape[dim + 1 :])
    run = x.name if (start, stop) == (0, n) else _slice_expr(x, dim, start, stop)
    expr = f"reshape(slice(reshape({run}, {_list(rows)}), axis={dim + 1}, start=0, end=1), {_list(shape)})"
    return w.let(expr, dtype, shape)


@_handles(aten.select.int, layout=True)
def _select(w: _Writer, node: Any, x: Val, dim: int, index: int) -> Val:
    dtype, shape = _out(node)
    dim %= len(x.shape)
    index %= x.shape[dim]
    return w.let(f"reshape({_slice_expr(x, dim, index, index + 1)}, {_list(shape)})", dtype, shape)


@_handles(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int)
def _split(w: _Writer, node: Any, x: Val, sizes: Any = 0, dim: int = 0) -> list:
    dim %= len(x.shape)
    if node.target == aten.unbind.int:
        dim, sizes = sizes % len(x.shape), [1] * x.shape[sizes % len(x.shape)]
    elif isinstance(sizes, int):
        n = x.shape[dim]
        sizes = [min(sizes, n - k) for k in range(0, n, sizes)]
    used = _used_results(node)
    results: List[Optional[Val]] = []
    start = 0
    for i, (size, val) in enumerate(zip(sizes, node.meta["val"])):
        if i in used:
            dtype, shape = _type(val)
            expr = _slice_expr(x, dim, start, start + size)
            if tuple(shape) != tuple(x.shape[:dim]) + (size,) + tuple(x.shape[dim + 1 :]):
                expr = f"reshape({expr}, {_list(shape)})"
            results.append(w.let(expr, dtype, shape))
        else:
            results.append(None)
        start += size
    return results


@_handles(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(w: _Writer, node: Any, a: Val, b: Val) -> Val:
    dtype, shape = _out(node)
    return w.let(f"{w.cast(a, dtype)} @ {w.cast(b, dtype)}", dtype, shape)


@_handles(aten.addmm.default, aten.baddbmm.default)
def _addmm(w: _Writer, node: Any, c: Val, a: Val, b: Val, *, beta: Any = 1, alpha: Any = 1) -> Val:
    dtype, shape = _out(node)
    prod = f"{a} @ {b}"
    if alpha != 1:
        prod = f"({prod}) * {_lit(alpha, dtype)}"
    if beta == 0:
        return w.let(prod, dtype, shape)
    bias = c.name if beta == 1 else f"{c} * {_lit(beta, dtype)}"
    return w.let(f"{prod} + {bias}", dtype, shape)


def _fill(w: _Writer, node: Any, value: Any) -> Val:
    """A tensor of the node's type holding `value` everywhere."""
    dtype, shape = _out(node)
    if dtype == "bool" or (isinstance(value, float) and not math.isfinite(value)):
        # `full` takes numbers; booleans, infinities and NaN are `tensor` constants.
        one = _lit(value, dtype)
        if dtype == "bool":
            one = f"tensor([{one}], [], dtype=bool)"
        return w.let(f"broadcast({one}, {_list(shape)})" if shape else one, dtype, shape)
    return w.let(f"full({_list(shape)}, {_lit(value, dtype)}, dtype={dtype})", dtype, shape)


@_handles(aten.full.default)
def _full(w: _Writer, node: Any, size: Sequence[int], value: Any, **kw: Any) -> Val:
    return _fill(w, node, value)


@_handles(aten.full_like.default)
def _full_like(w: _Writer, node: Any, x: Val, value: Any, **kw: Any) -> Val:
    return _fill(w, node, value)


@_handles(aten.scalar_tensor.default)
def _scalar_tensor(w: _Writer, node: Any, value: Any, **kw: Any) -> Val:
    return _fill(w, node, value)


@_handles(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(w: _Writer, node: Any, *args: Any, **kw: Any) -> Val:
    dtype, shape = _out(node)
    if node.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else 1
    if dtype in _FLOATS:
        raise Unsupported("a float range")
    return w.let(f"arange({start}, {end}, {step}, dtype={dtype})", dtype, shape)


@_handles(aten.embedding.default)
def _embedding(w: _Writer, node: Any, weight: Val, indices: Val, *args: Any) -> Val:
    dtype, shape = _out(node)
    return w.let(f"gather({weight}, {indices}, axis=0)", dtype, shape)


@_handles(aten.index_select.default)
def _index_select(w: _Writer, node: Any, x: Val, dim: int, index: Val) -> Val:
    dtype, shape = _out(node)
    return w.let(f"gather({x}, {index}, axis={dim % len(x.shape)})", dtype, shape)


@_handles(aten.gather.default)
def _gather(w: _Writer, node: Any, x: Val, dim: int, index: Val, *args: Any) -> Val:
    dtype, shape = _out(node)
    if args and args[0]:
        raise Unsupported("gather with sparse_grad")
    return w.let(f"gather_elements({x}, {index}, axis={dim % len(x.shape)})", dtype, shape)


@_handles(aten.scatter_add.default)
def _scatter_add(w: _Writer, node: Any, x: Val, dim: int, index: Val, src: Val) -> Val:
    dtype, shape = _out(node)
    if list(src.shape) != list(index.shape):
        raise Unsupported("scatter_add with a source larger than its index")
    return w.let(f"scatter_add_elements({x}, {index}, {src}, axis={dim % len(x.shape)})", dtype, shape)


@_handles(aten.index_put.default)
def _index_put(w: _Writer, node: Any, x: Val, indices: Sequence[Any], values: Val, accumulate: bool = False) -> Val:
    """`x[indices] += values` along the first axis (an embedding's gradient):
    dlc's `scatter_add`. Without `accumulate`, or on several axes, PyTorch."""
    dtype, shape = _out(node)
    if not accumulate:
        raise Unsupported("index_put without accumulate")
    if len(indices) != 1 or not isinstance(indices[0], Val) or indices[0].dtype == "bool":
        raise Unsupported("index_put on several axes or by a mask")
    index = indices[0]
    if tuple(values.shape) != tuple(index.shape) + tuple(x.shape[1:]):
        raise Unsupported("index_put with broadcast values")
    return w.let(f"scatter_add({x}, {index}, {w.cast(values, dtype)}, axis=0)", dtype, shape)


@_handles(aten.constant_pad_nd.default)
def _pad(w: _Writer, node: Any, x: Val, pad: Sequence[int], value: Any = 0) -> Val:
    dtype, shape = _out(node)
    if any(p < 0 for p in pad):
        raise Unsupported("negative padding")
    per_axis = [0, 0] * len(x.shape)
    for k in range(len(pad) // 2):
        axis = len(x.shape) - 1 - k
        per_axis[2 * axis], per_axis[2 * axis + 1] = pad[2 * k], pad[2 * k + 1]
    return w.let(f"pad({x}, {_list(per_axis)}, value={_lit(value, dtype)})", dtype, shape)


def _getitem(w: _Writer, node: Any, results: Sequence[Any], i: int) -> Any:
    r = results[i]
    if r is None:
        raise Unsupported("a result dlc does not compute")
    return r


_handles(operator.getitem, layout=True)(_getitem)


# ---------------------------------------------------------------- support

def _node_support(node: Any) -> Optional[str]:
    """None when `node` translates; otherwise why not."""
    if node.op != "call_function":
        return "not an operator"
    if node.target not in _HANDLERS:
        return "not translated"
    if node.target is operator.getitem:
        producer = node.args[0]
        return _node_support(producer) if isinstance(producer, torch.fx.Node) else "not a result"
    try:
        vals = node.meta.get("val")
        if isinstance(vals, (list, tuple)):
            # Of several results, those read (an unused statistic may be empty).
            used = _used_results(node)
            vals = [v for i, v in enumerate(vals) if i in used]
        for v in vals if isinstance(vals, list) else [vals]:
            if v is not None:
                _type(v)
        for a in node.all_input_nodes:
            v = a.meta.get("val")
            if isinstance(v, torch.Tensor):
                _type(v)
        # Translate the node alone, on stand-ins for its operands, to find what
        # it refuses for its arguments (a dilated convolution, a step).
        _translate_alone(node)
    except Unsupported as e:
        return str(e)
    return None


def _translate_alone(node: Any) -> None:
    w = _Writer()
    env = {}
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            env[a] = Val(a.name, *_type(v))
        elif isinstance(v, (list, tuple)):
            env[a] = [Val(a.name, *_type(t)) if isinstance(t, torch.Tensor) else None for t in v]
        else:
            raise Unsupported("an operand that is not a tensor")
    _apply(w, node, env)


def _apply(w: _Writer, node: Any, env: Dict[Any, Any]) -> Any:
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "layout", "pin_memory", "memory_format", "non_blocking")}
    return _HANDLERS[node.target](w, node, *args, **kwargs)


class _Support(OperatorSupportBase):
    def __init__(self) -> None:
        super().__init__()
        self.why: Dict[Any, str] = {}

    def is_node_supported(self, submodules: Any, node: Any) -> bool:
        if node not in self.why:
            self.why[node] = _node_support(node) or ""
        return not self.why[node]


# ---------------------------------------------------------------- compiling

def _source(gm: torch.fx.GraphModule) -> Tuple[str, List[Any]]:
    """The dlc function computing `gm` (every node supported), and how its
    outputs map to the graph's: ("value", index) of the function's results,
    ("input", index) for an input returned as it is, or ("none", None)."""
    w = _Writer()
    env: Dict[Any, Any] = {}
    params = []
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(inputs):
        dtype, shape = _type(n.meta["val"])
        env[n] = Val(f"p{i}", dtype, shape)
        params.append(f"p{i}: {_tensor_type(dtype, shape)}")
    output = None
    for n in gm.graph.nodes:
        if n.op == "call_function":
            env[n] = _apply(w, n, env)
        elif n.op == "output":
            output = n
    outs = output.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    results: List[Val] = []
    spec: List[Any] = []
    input_names = {env[n].name: i for i, n in enumerate(inputs)}
    for o in outs:
        if o is None:
            spec.append(("none", None))
            continue
        v = env[o]
        if v.name in input_names:
            spec.append(("input", input_names[v.name]))
            continue
        names = [r.name for r in results]
        if v.name in names:
            spec.append(("value", names.index(v.name)))
        else:
            spec.append(("value", len(results)))
            results.append(v)
    types = [_tensor_type(v.dtype, v.shape) for v in results]
    ret = types[0] if len(types) == 1 else f"({', '.join(types)})"
    value = results[0].name if len(results) == 1 else f"({', '.join(r.name for r in results)})"
    body = "\n".join(w.lines)
    text = "".join(w.ops) + "".join(w.fns) + f"fn graph({', '.join(params)}) -> {ret} {{\n{body}\n    return {value};\n}}\n"
    return text, spec


class _DlcKernel(torch.nn.Module):
    """A part of a graph compiled by dlc, called on the tensors' own memory."""

    def __init__(self, module: Any, spec: List[Any], source: str) -> None:
        super().__init__()
        self.module = module
        self.spec = spec
        self.source = source
        inv = {v: k for k, v in _DTYPES.items()}
        self.types = [(p.dtype, list(p.shape), inv[p.dtype], torch.Size(p.shape)) for p in module.inputs]
        # The view each input had at the last call. Parameters come back at
        # the same address call after call, and their views are reused; a
        # view holds no tensor (the call's arguments keep the memory alive
        # while it runs), so nothing is kept between calls.
        self.cache: List[Any] = [None] * len(self.types)

    def forward(self, *args: torch.Tensor) -> Any:
        views, kept = [], []
        for i, t in enumerate(args):
            dtype, shape, torch_dtype, size = self.types[i]
            if t.dtype != torch_dtype or t.shape != size:
                raise TypeError(f"dlc: input {i} is {t.dtype}{list(t.shape)}, compiled for {dtype}{shape}")
            if not t.is_contiguous():
                t = t.contiguous()
                kept.append(t)  # the copy lives until the call is done
            address = t.data_ptr()
            v = self.cache[i]
            if v is None or v.address != address:
                v = self.cache[i] = _dlc.View.from_parts(address, dtype, shape, True, None)
            views.append(v)
        results = self.module._fn.call(views, [])
        del kept
        values = [torch.from_dlpack(r) for r in results]
        out = []
        for kind, i in self.spec:
            if kind == "value":
                out.append(values[i])
            elif kind == "input":
                out.append(args[i])
            else:
                out.append(None)
        return out[0] if len(out) == 1 else tuple(out)


def _compile_part(gm: torch.fx.GraphModule) -> _DlcKernel:
    text, spec = _source(gm)
    return _DlcKernel(dlc_compile(text), spec, text)


def _boxed(f: Callable[..., Any]) -> Callable[..., Any]:
    def call(args: List[Any]) -> Any:
        return f(*args)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def _warn(message: str) -> None:
    warnings.warn(f"dlc: {message}", RuntimeWarning, stacklevel=3)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Compiles an FX graph of core ATen operators: the parts dlc translates
    run as dlc code, the rest in PyTorch. Returns a boxed callable (AOTAutograd's
    convention: it takes the list of inputs)."""
    stats["graphs"] += 1
    try:
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                _type(n.meta["val"])
    except (Unsupported, KeyError) as e:
        _warn(f"a graph with {e} runs in PyTorch (use torch.compile(..., dynamic=False) to compile each shape)")
        return _boxed(gm.forward)
    support = _Support()
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = [
        p
        for p in partitioner.propose_partitions()
        if any(n.target not in _LAYOUT_ONLY for n in p.nodes)
    ]
    left = {}
    for n in gm.graph.nodes:
        # A result of an operator left to PyTorch is not reported again.
        if n.op == "call_function" and n.target is not operator.getitem and not support.is_node_supported(None, n):
            key = str(n.target)
            left[key] = left.get(key, 0) + 1
            stats["left_to_pytorch"][key] = stats["left_to_pytorch"].get(key, 0) + 1
    if left:
        reasons = {}
        for node, why in support.why.items():
            if why:
                reasons.setdefault(str(node.target), why)
        _warn(
            "left to PyTorch: "
            + ", ".join(f"{k} x{v} ({reasons.get(k, 'not translated')})" for k, v in sorted(left.items()))
        )
    if not partitions:
        return _boxed(gm.forward)
    fused = partitioner.fuse_partitions(partitions)
    for n in list(fused.graph.nodes):
        if n.op != "call_module" or not str(n.target).startswith("fused_"):
            continue
        part = getattr(fused, n.target)
        try:
            kernel = _compile_part(part)
        except Exception as e:  # never stop the user's program: run the part in PyTorch
            _warn(f"a part of {sum(1 for m in part.graph.nodes if m.op == 'call_function')} operators runs in PyTorch: {str(e).splitlines()[0]}")
            continue
        setattr(fused, n.target, kernel)
        stats["compiled"] += 1
        stats["ops"] += sum(1 for m in part.graph.nodes if m.op == "call_function")
    fused.recompile()
    return _boxed(fused.forward)


backend = aot_autograd(fw_compiler=compile_graph, decompositions=core_aten_decompositions)
"""The ``torch.compile`` backend (``backend="dlc"``, or pass this object)."""
