"""Type stubs of dlc's native module (python/src/lib.rs). Use the ``dlc``
package's API (``dlc.compile``, ``dlc.Module``); this module is its engine."""

import builtins
from typing import Any, List, Optional, Sequence, Tuple

DEFAULT_PIPELINE: str
"""The graph passes ``dlc.compile`` runs when ``passes`` is None."""

class CompileError(Exception):
    """A model that could not be compiled. ``str(e)`` is the full diagnostic
    text; ``file``, ``line`` and ``column`` (1-based) locate the first
    diagnostic, each None where the error has no such place."""

    file: Optional[str]
    line: Optional[int]
    column: Optional[int]

class RuntimeError(builtins.RuntimeError):
    """Compiled code that failed while it ran (integer division by zero, out
    of memory): the message names the failing op's source place."""

class View:
    """A tensor the caller owns, described for a call without a copy."""

    @staticmethod
    def from_interface(
        address: int,
        typestr: str,
        shape: Sequence[int],
        strides: Optional[Sequence[int]],
        owner: Any,
    ) -> "View":
        """A view of NumPy's ``__array_interface__`` (strides in bytes, None for C order)."""
    @staticmethod
    def from_array_struct(capsule: Any, owner: Any) -> "View":
        """A view of a NumPy array's ``__array_struct__`` capsule."""
    @staticmethod
    def from_parts(address: int, dtype: str, shape: Sequence[int], contiguous: bool, owner: Any) -> "View":
        """A view of a tensor given by its parts (dtype by its dlc name: ``f32``). The
        address is trusted: ``owner`` keeps the memory alive, or is None where the
        caller keeps it alive for every call the view is passed to (the
        torch.compile backend, whose views are of the call's own arguments)."""
    @staticmethod
    def from_dlpack(capsule: Any, owner: Any) -> "View":
        """A view of a ``dltensor`` capsule, which it consumes (its deleter runs when the view goes)."""
    @property
    def address(self) -> int:
        """The address of the first element."""
    @property
    def dtype(self) -> Optional[str]:
        """The element type's dlc name, None when dlc has none."""
    @property
    def shape(self) -> List[int]:
        """The extents."""

class Tensor:
    """A result of a call: memory the compiled code wrote, shared through
    DLPack (``numpy.from_dlpack(t)``, ``torch.from_dlpack(t)``) without a
    copy and kept alive by whoever holds it."""

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """An unversioned ``dltensor`` capsule of the tensor (``copy=True`` is refused)."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """(1, 0): the CPU."""
    @property
    def dtype(self) -> str:
        """The element type's dlc name (``f32``, ``bf16``, ...)."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The extents."""
    def data_ptr(self) -> int:
        """The address of the first element."""

class Function:
    """A compiled entry point (``dlc.Module`` wraps one)."""

    @property
    def name(self) -> str:
        """The entry point's name."""
    def call(self, args: Sequence[View], named: Sequence[Tuple[str, View]]) -> List[Tensor]:
        """Runs the entry point with the GIL released; raises TypeError for inputs that do not fit."""
    def bind(self, named: Sequence[Tuple[str, View]]) -> "Function":
        """The entry point with these inputs given once (copied); runs the preparer when it can."""
    def signature(self) -> List[Tuple[str, str, List[int], str]]:
        """(name, dtype, shape, role) of every open input, then every output."""
    def ir(self, level: str) -> str:
        """The program at ``graph``, ``loop``, ``tile`` or ``llvm`` level, as text."""
    def compile_stats(self) -> Tuple[float, int, int]:
        """(code generation seconds, parts, parts from the object cache)."""
    def grad(self, wrt: Optional[Sequence[str]] = None) -> "Function":
        """The value and the gradient with respect to ``wrt`` (default: the weights), compiled."""
    def save(self, path: str) -> None:
        """Writes ``path/module-HASH.so`` and ``path/module.json`` (atomically)."""

def set_num_threads(n: int) -> None:
    """How many threads compiled code runs on (0: one per core)."""

def load(path: str) -> Function:
    """Loads a saved module's library; raises OSError or ValueError."""

def compile(
    name: str,
    text: Optional[str] = None,
    path: Optional[str] = None,
    onnx: Optional[bytes] = None,
    entry: Optional[str] = None,
    passes: Optional[str] = None,
    weights: Optional[str] = None,
    cache: bool = True,
) -> Function:
    """Compiles exactly one of ``text``, ``path`` or ``onnx`` for this CPU; raises CompileError."""
