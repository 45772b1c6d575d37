"""dlc, a deep-learning compiler, from Python.

``dlc.compile`` reads a model (dlc source, a ``.dl`` file, graph IR, or an
ONNX model as a path or bytes), runs the compiler's passes and compiles the
entry point for this CPU in process; the ``Module`` it returns is called on
NumPy arrays, PyTorch or JAX CPU tensors, or anything with ``__dlpack__`` or
the buffer protocol, read in place without copies. Results are NumPy arrays
that own the memory the compiled code wrote (``Module.tensors`` hands them
out as DLPack tensors instead, for ``torch.from_dlpack``)::

    import dlc, numpy as np
    m = dlc.compile("fn f(x: f32[2, 3]) -> f32[2, 3] { return relu(x) * 2.0; }")
    y = m(np.ones((2, 3), np.float32))
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dlc
from ._dlc import DEFAULT_PIPELINE, CompileError, RuntimeError, Tensor, set_num_threads

__all__ = [
    "DEFAULT_PIPELINE",
    "CompileError",
    "Module",
    "Param",
    "RuntimeError",
    "Tensor",
    "compile",
    "load",
    "set_num_threads",
]

# The NumPy type of each dlc element type (bf16 has none in NumPy itself).
_NUMPY_TYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "bool": np.bool_,
}

_LEVELS = ("graph", "loop", "tile", "llvm")


class Param(NamedTuple):
    """A parameter of a compiled entry point."""

    name: str
    """Its name in the source."""
    dtype: str
    """Its element type, as dlc names it (``f32``, ``bf16``, ``i64``, ``bool``...)."""
    shape: Tuple[int, ...]
    """Its extents."""
    role: str
    """``input``, ``weight`` (an input declared ``weight``, which ``Module.bind`` can give once) or ``output``."""


PathLike = Union[str, "os.PathLike[str]"]


def _is_path(source: Any) -> bool:
    """Whether ``compile``'s first argument names a file rather than holding source text."""
    if isinstance(source, os.PathLike):
        return True
    if not isinstance(source, str) or "\n" in source or "{" in source:
        return False
    return source.endswith((".dl", ".onnx", ".graph", ".mlir")) or os.path.isfile(source)


def compile(
    source_or_path: Union[str, "os.PathLike[str]", bytes],
    entry: Optional[str] = None,
    target: Optional[str] = None,
    passes: Optional[str] = None,
    weights: Optional[PathLike] = None,
    cache: bool = True,
) -> "Module":
    """Compiles a model for this CPU.

    ``source_or_path`` is a path (``str`` or ``os.PathLike``) to a ``.dl``
    source, graph IR or ``.onnx`` file; ``bytes`` are an ONNX model; any
    other ``str`` is dlc source text. ``entry`` names the entry point (needed
    when there are several; an ONNX model's own by default). ``target`` must
    be ``None``, ``"host"`` or ``"native"``: compiled code runs in this
    process, on this CPU (``DLC_CPU=x86-64-v3`` compiles for AVX2 instead,
    as for the ``dlc`` command). ``passes`` is the graph pipeline
    (``DEFAULT_PIPELINE``). ``weights`` (a directory of ``NAME.npy`` or a
    ``.safetensors`` file) builds the ``weight`` parameters into the code as
    constants: they leave the signature. ``cache`` keeps compiled objects in
    the user's cache, which ``dlc run`` shares.

    Raises ``CompileError`` (with ``file``, ``line``, ``column``) for a model
    that does not compile, ``FileNotFoundError`` for a missing file.
    """
    if target not in (None, "host", "native"):
        raise ValueError(
            f"target {target!r}: the Python package compiles for this CPU (None, 'host' or "
            "'native'); other targets are the `dlc compile --target` command's"
        )
    weights = os.fspath(weights) if weights is not None else None
    common = dict(entry=entry, passes=passes, weights=weights, cache=cache)
    if isinstance(source_or_path, (bytes, bytearray, memoryview)):
        fn = _dlc.compile("model.onnx", onnx=bytes(source_or_path), **common)
    elif _is_path(source_or_path):
        path = os.fspath(source_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no model file {path}")
        fn = _dlc.compile(path, path=path, **common)
    elif isinstance(source_or_path, str):
        fn = _dlc.compile("<string>", text=source_or_path, **common)
    else:
        raise TypeError(
            "compile takes dlc source text, a path or ONNX bytes, got "
            f"{type(source_or_path).__name__}"
        )
    return Module(fn)


def load(path: PathLike) -> "Module":
    """Loads a module ``Module.save`` wrote (its shared library: nothing is
    compiled). Raises ``OSError`` where ``path`` holds no saved module and
    ``ValueError`` for one this machine cannot run (compiled for a CPU with
    wider vectors or AVX-512 BF16) or a damaged one."""
    return Module(_dlc.load(os.fspath(path)))


def _view(x: Any, param: Param) -> "_dlc.View":
    """``x`` described for the compiled code, in place: NumPy arrays through
    their array interface, other tensors through DLPack, buffers through
    NumPy (which shares their memory); Python numbers for a scalar
    parameter become one."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.ndarray):
        x = np.asarray(x, dtype=_NUMPY_TYPES.get(param.dtype))
    if type(x) is np.ndarray:
        return _dlc.View.from_array_struct(x.__array_struct__, x)
    if isinstance(x, np.ndarray):
        ai = x.__array_interface__
        return _dlc.View.from_interface(
            ai["data"][0], ai["typestr"], list(ai["shape"]), ai.get("strides"), x
        )
    if hasattr(x, "__dlpack__"):
        try:
            capsule = x.__dlpack__()
        except Exception as e:  # the producer's reason, with the parameter's name
            raise TypeError(f"input `{param.name}`: {type(x).__name__}.__dlpack__() failed: {e}") from e
        return _dlc.View.from_dlpack(capsule, x)
    try:
        memoryview(x)
    except TypeError:
        raise TypeError(
            f"input `{param.name}` must be a tensor ({param.dtype}{list(param.shape)}): a NumPy "
            f"array, an object with __dlpack__ or the buffer protocol; got {type(x).__name__}"
        ) from None
    return _view(np.asarray(x), param)


class Module:
    """A compiled entry point, called like a function.

    ``module(*inputs, **named)`` takes the inputs in order and by name and
    returns the result (a tuple when there are several) as NumPy arrays.
    Inputs are read in place and must be C-contiguous, of the parameter's
    element type and shape, on the CPU; anything else is a ``TypeError``
    naming the parameter. Compiled code runs with the GIL released, so
    threads run calls in parallel.
    """

    def __init__(self, function: "_dlc.Function") -> None:
        self._fn = function
        self._signature = [Param(n, d, tuple(s), r) for n, d, s, r in function.signature()]
        self._inputs = [p for p in self._signature if p.role != "output"]

    @property
    def name(self) -> str:
        """The entry point's name."""
        return self._fn.name

    @property
    def signature(self) -> list:
        """Every parameter: the inputs (``input`` and ``weight``) in call order, then the outputs."""
        return list(self._signature)

    @property
    def inputs(self) -> list:
        """The parameters a call takes, in order."""
        return list(self._inputs)

    @property
    def outputs(self) -> list:
        """The results, in order."""
        return [p for p in self._signature if p.role == "output"]

    def _named_views(self, named: Mapping[str, Any], what: str = "") -> list:
        """(name, view) of each input given by name; `what` says what the names are for."""
        by_name = {p.name: p for p in self._inputs}
        views = []
        for k, x in named.items():
            p = by_name.get(k)
            if p is None:
                raise TypeError(
                    f"`{self.name}` has no input `{k}`{what}; its inputs: {', '.join(by_name) or 'none'}"
                )
            views.append((k, _view(x, p)))
        return views

    def _views(self, args: tuple, named: Mapping[str, Any]):
        if len(args) > len(self._inputs):
            raise TypeError(f"`{self.name}` takes {len(self._inputs)} input(s), got {len(args) + len(named)}")
        return [_view(x, p) for x, p in zip(args, self._inputs)], self._named_views(named)

    def tensors(self, *args: Any, **named: Any) -> Tuple[Tensor, ...]:
        """Calls the entry point; returns every result as a ``dlc.Tensor``
        (DLPack: ``numpy.from_dlpack``, ``torch.from_dlpack`` take it
        without a copy)."""
        views, kw = self._views(args, named)
        return tuple(self._fn.call(views, kw))

    def __call__(self, *args: Any, **named: Any) -> Any:
        results = tuple(
            t if t.dtype == "bf16" else np.from_dlpack(t) for t in self.tensors(*args, **named)
        )
        return results[0] if len(results) == 1 else results

    def bind(self, weights: Mapping[str, Any]) -> "Module":
        """The entry point with the inputs ``weights`` names given once
        (copied: later changes to the arrays do not reach it). When they
        are all the weights its compiled preparer reads (packed panels of a
        product's weight, ...), the preparer runs now, once, not at every
        call. The returned module takes the other inputs."""
        if not isinstance(weights, Mapping):
            raise TypeError(f"bind takes a mapping of input names to tensors, got {type(weights).__name__}")
        return Module(self._fn.bind(self._named_views(weights, " to bind")))

    def grad(self, wrt: Optional[Sequence[str]] = None) -> "Module":
        """The entry point's value and gradient, compiled from the same
        source (as ``dlc grad`` does): the results are the entry point's
        (``out0``...), then ``grad_NAME`` for each parameter of ``wrt``, by
        default its ``weight`` parameters (every float one when it declares
        none). A whole training step (forward, backward, optimizer update) is
        an ordinary entry point written with ``value_and_grad`` and an
        optimizer built-in, compiled and called like any other."""
        return Module(self._fn.grad(list(wrt) if wrt is not None else None))

    def save(self, path: PathLike) -> None:
        """Writes the compiled entry point to the directory ``path``: the
        shared library ``module-HASH.so`` (linked by the system's C compiler) and
        ``module.json``; ``dlc.load(path)`` runs it without compiling. The
        directory appears whole or not at all; an existing one is replaced
        only when it holds a saved module. A bound module's weights are not
        saved: save before ``bind``. The code runs on CPUs with the vector
        width (and AVX-512 BF16) of this one; save under
        ``DLC_CPU=x86-64-v3`` for any AVX2 machine."""
        self._fn.save(os.fspath(path))

    def ir(self, level: str = "graph") -> str:
        """The program as text at ``level``: ``graph`` (after the passes),
        ``loop``, ``tile`` (scheduled for this CPU) or ``llvm`` (optimized
        LLVM IR)."""
        if level not in _LEVELS:
            raise ValueError(f"no level {level!r}: {', '.join(_LEVELS)}")
        return self._fn.ir(level)

    @property
    def compile_stats(self) -> Tuple[float, int, int]:
        """(seconds code generation took, parts compiled, parts taken from the object cache)."""
        return self._fn.compile_stats()

    def __repr__(self) -> str:
        def show(ps):
            return ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in ps)

        return f"<dlc.Module {self.name}({show(self._inputs)}) -> ({show(self.outputs)})>"
