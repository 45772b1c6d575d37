"""The dlc Python package: compiling, calling without copies, binding weights,
reading IR, and every error a user can cause. `make test` runs these against
the package `pip install ./python` built."""

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import dlc

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)

DENSE = "fn dense(x: f32[4, 8], weight w: f32[8, 3], weight b: f32[3]) -> f32[4, 3] { return relu(x @ w + b); }"


def rand(*shape, dtype=np.float32):
    return (RNG.random(shape) * 2 - 1).astype(dtype)


@pytest.fixture(scope="module")
def dense():
    return dlc.compile(DENSE)


def reference_dense(x, w, b):
    return np.maximum(x.astype(np.float64) @ w + b, 0)


def test_compile_and_call_source_text(dense):
    x, w, b = rand(4, 8), rand(8, 3), rand(3)
    y = dense(x, w, b)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (4, 3)
    np.testing.assert_allclose(y, reference_dense(x, w, b), rtol=1e-5, atol=1e-6)
    # The same by name, and mixed.
    np.testing.assert_array_equal(dense(x, b=b, w=w), y)
    np.testing.assert_array_equal(dense(w=w, x=x, b=b), y)


def test_signature_names_roles(dense):
    assert dense.name == "dense"
    assert dense.signature == [
        dlc.Param("x", "f32", (4, 8), "input"),
        dlc.Param("w", "f32", (8, 3), "weight"),
        dlc.Param("b", "f32", (3,), "weight"),
        dlc.Param("out0", "f32", (4, 3), "output"),
    ]
    assert [p.name for p in dense.inputs] == ["x", "w", "b"]
    assert "dense(x: f32[4, 8]" in repr(dense)


def test_several_results_are_a_tuple():
    m = dlc.compile("fn two(x: f32[3]) -> (f32[3], f32) { return (x * 2.0, sum(x)); }")
    x = np.array([1, 2, 3], np.float32)
    doubled, total = m(x)
    np.testing.assert_array_equal(doubled, [2, 4, 6])
    assert total.shape == () and float(total) == 6.0


def test_file_paths_and_entry_points(tmp_path):
    m = dlc.compile(ROOT / "examples" / "w1_gemm.dl", entry="gemm_1024")
    a, b = rand(*m.inputs[0].shape), rand(*m.inputs[1].shape)
    np.testing.assert_allclose(m(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    with pytest.raises(dlc.CompileError, match="entry points; choose one with entry=: gemm_"):
        dlc.compile(str(ROOT / "examples" / "w1_gemm.dl"))
    with pytest.raises(dlc.CompileError, match="no entry point `nope`"):
        dlc.compile(ROOT / "examples" / "w1_gemm.dl", entry="nope")
    with pytest.raises(FileNotFoundError):
        dlc.compile(tmp_path / "missing.dl")


def test_onnx_from_path_and_bytes():
    folder = ROOT / "tests" / "onnx" / "mlp"
    x = np.load(folder / "x.npy")
    expected = np.load(folder / "out0.npy")
    by_path = dlc.compile(folder / "model.onnx")
    by_bytes = dlc.compile((folder / "model.onnx").read_bytes())
    for m in (by_path, by_bytes):
        np.testing.assert_allclose(m(x), expected, rtol=1e-4, atol=1e-5)
    # Weights in an external data file are found beside the model's path;
    # a model given as bytes has no place to look.
    folder = ROOT / "tests" / "onnx" / "torch_encoder_external"
    m = dlc.compile(folder / "model.onnx")
    np.testing.assert_allclose(
        m(np.load(folder / "ids.npy")), np.load(folder / "out0.npy"), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(dlc.CompileError, match="import the model from its file"):
        dlc.compile((folder / "model.onnx").read_bytes())


def test_inputs_are_read_in_place():
    # The address the compiled code is handed is the caller's own: for a
    # NumPy array, a view into a larger one, a buffer, and a DLPack tensor.
    base = rand(4, 8)
    for x in (base, rand(3, 4, 8)[1]):
        v = dlc._dlc.View.from_interface(*_interface(x), x)
        assert v.address == x.ctypes.data
    # NumPy's C-level interface (the fast path) reads what the dictionary says.
    for x in (base, np.arange(6, dtype=np.int64).reshape(2, 3), np.array([True, False]), np.float16(1.5) * np.ones(3), base.T, base[:, ::2], np.float64(2.0) * np.ones(())):
        fast = dlc._dlc.View.from_array_struct(x.__array_struct__, x)
        slow = dlc._dlc.View.from_interface(*_interface(x), x)
        assert (fast.address, fast.dtype, fast.shape) == (slow.address, slow.dtype, slow.shape)
    m = dlc.compile("fn f(x: f32[4, 8]) -> f32[4, 8] { return x * 2.0; }")
    buf = bytearray(base.tobytes())
    view = memoryview(buf).cast("B").cast("f", (4, 8))
    assert dlc._view(view, m.inputs[0]).address == np.frombuffer(buf, np.float32).ctypes.data
    np.testing.assert_array_equal(m(view), base * 2)
    wrapped = DLPackOnly(base)
    assert dlc._view(wrapped, m.inputs[0]).address == base.ctypes.data
    np.testing.assert_array_equal(m(wrapped), base * 2)


def test_results_are_shared_not_copied():
    m = dlc.compile("fn f(x: f32[2, 3]) -> f32[2, 3] { return x + 1.0; }")
    (t,) = m.tensors(np.zeros((2, 3), np.float32))
    assert t.dtype == "f32" and t.shape == (2, 3) and t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, np.ones((2, 3)))
    # DLPack 1.0 says the memory is writable; the unversioned capsule, which
    # consumers asking for no version get, cannot, and NumPy reads it as read-only.
    assert a.flags.writeable
    legacy = np.from_dlpack(DLPackOnly(t, versions=False))
    assert legacy.ctypes.data == t.data_ptr() and not legacy.flags.writeable
    del t  # the array keeps the buffer alive
    np.testing.assert_array_equal(a, np.ones((2, 3)))
    # Each call writes fresh results: earlier ones are not overwritten.
    first = m(np.zeros((2, 3), np.float32))
    first[1, 1] = 7  # results are the caller's to write
    second = m(np.full((2, 3), 5, np.float32))
    assert first[0, 0] == 1 and second[0, 0] == 6


def test_integer_bool_and_scalar_parameters():
    m = dlc.compile(
        "fn f(x: i64[4], k: i64, on: bool[4]) -> i64[4] { return where(on, x * k, x); }"
    )
    x = np.array([1, -2, 3, 4], np.int64)
    on = np.array([True, False, True, False])
    np.testing.assert_array_equal(m(x, 3, on), [3, -2, 9, 4])


def test_wrong_inputs_are_type_errors_naming_the_parameter(dense):
    x, w, b = rand(4, 8), rand(8, 3), rand(3)
    with pytest.raises(TypeError, match=r"input `x` must be a C-contiguous f32\[4, 8\].*got f64\[4, 8\]"):
        dense(x.astype(np.float64), w, b)
    with pytest.raises(TypeError, match=r"input `w` must be .*f32\[8, 3\].*got f32\[3, 8\]"):
        dense(x, w.T.copy(), b)
    with pytest.raises(TypeError, match=r"input `w`.*not C-contiguous"):
        dense(x, np.asfortranarray(w), b)
    with pytest.raises(TypeError, match=r"input `x`.*got f32\[4, 8\] that is not C-contiguous"):
        dense(rand(4, 16)[:, ::2], w, b)
    with pytest.raises(TypeError, match=r"missing `b` \(f32\[3\]\)"):
        dense(x, w)
    with pytest.raises(TypeError, match="takes 3 input"):
        dense(x, w, b, b)
    with pytest.raises(TypeError, match="no input `bias`; its inputs: x, w, b"):
        dense(x, w, bias=b)
    with pytest.raises(TypeError, match="input `x` given twice"):
        dense(x, w, b, x=x)
    with pytest.raises(TypeError, match=r"input `x` must be a tensor \(f32\[4, 8\]\).*got list"):
        dense(x.tolist(), w, b)


def test_non_cpu_dlpack_tensors_are_refused(dense):
    class OnGpu(DLPackOnly):
        def __dlpack__(self, **kw):
            raise BufferError("the tensor is on cuda:0")

    with pytest.raises(TypeError, match=r"input `x`: OnGpu.__dlpack__\(\) failed: the tensor is on cuda:0"):
        dense(OnGpu(rand(4, 8)), rand(8, 3), rand(3))


def test_compile_errors_carry_the_place(tmp_path):
    with pytest.raises(dlc.CompileError) as e:
        dlc.compile("fn f(x: f32[2]) -> f32[2] {\n    return x + zz;\n}")
    assert (e.value.file, e.value.line, e.value.column) == ("<string>", 2, 16)
    assert "unknown name `zz`" in str(e.value) and "--> <string>:2:16" in str(e.value)
    bad = tmp_path / "bad.dl"
    bad.write_bytes(b"fn f(x: f32[2]) -> f32[2] { return x; }\n// \xff\n")
    with pytest.raises(dlc.CompileError, match="not valid UTF-8") as e:
        dlc.compile(bad)
    assert (e.value.file, e.value.line, e.value.column) == (str(bad), 2, 4)
    with pytest.raises(dlc.CompileError) as e:
        dlc.compile(b"not an onnx model")
    assert e.value.file == "model.onnx" and e.value.line is None
    with pytest.raises(ValueError, match="compiles for this CPU"):
        dlc.compile(DENSE, target="sm_90")
    with pytest.raises(dlc.CompileError, match="unknown pass"):
        dlc.compile(DENSE, passes="graph.nonsense")


def test_failures_at_run_time_name_the_source_place():
    m = dlc.compile("fn div(a: i32[4], b: i32[4]) -> i32[4] {\n    return a / b;\n}")
    a = np.array([4, 6, 8, 10], np.int32)
    np.testing.assert_array_equal(m(a, np.array([2, 3, 4, 5], np.int32)), [2, 2, 2, 2])
    with pytest.raises(dlc.RuntimeError, match=r"integer division by zero at <string>:2:") as e:
        m(a, np.array([1, 0, 1, 1], np.int32))
    assert isinstance(e.value, RuntimeError)


def test_bind_gives_weights_once(dense):
    x, w, b = rand(4, 8), rand(8, 3), rand(3)
    full = dense(x, w, b)
    bound = dense.bind({"w": w, "b": b})
    assert [p.name for p in bound.inputs] == ["x"]
    np.testing.assert_array_equal(bound(x), full)
    # The weights were copied: changing them later changes nothing.
    w[:] = 0
    np.testing.assert_array_equal(bound(x), full)
    with pytest.raises(TypeError, match="no input `w` to bind"):
        bound.bind({"w": w})
    partly = dense.bind({"b": b})
    np.testing.assert_array_equal(partly(x, w=np.zeros_like(w)), np.maximum(np.broadcast_to(b, (4, 3)), 0))


def test_bind_runs_the_preparer_of_packed_weights():
    # examples/language/weights.dl's product packs `w` in a preparer.
    m = dlc.compile(ROOT / "examples" / "language" / "weights.dl")
    assert "dense_prepare" in m.ir("tile")
    x, w, b = rand(32, 256), rand(256, 128), rand(128)
    expected = np.maximum(x.astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(m(x, w, b), expected, rtol=1e-4, atol=1e-4)
    bound = m.bind({"w": w, "b": b})
    for _ in range(2):
        np.testing.assert_allclose(bound(x), expected, rtol=1e-4, atol=1e-4)


def test_ir_at_every_level(dense):
    assert dense.ir().startswith("graph.func @dense") or "graph.func @dense" in dense.ir("graph")
    assert "loop.func @dense" in dense.ir("loop")
    assert "tile.func @dense" in dense.ir("tile")
    assert "define" in dense.ir("llvm") and "dlc_" in dense.ir("llvm")
    with pytest.raises(ValueError, match="no level 'ptx'"):
        dense.ir("ptx")


def test_weights_as_constants(tmp_path):
    w, b = rand(8, 3), rand(3)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "b.npy", b)
    m = dlc.compile(DENSE, weights=tmp_path)
    assert [p.name for p in m.inputs] == ["x"]
    x = rand(4, 8)
    np.testing.assert_allclose(m(x), reference_dense(x, w, b), rtol=1e-5, atol=1e-6)


def test_threads_call_one_module_at_once():
    m = dlc.compile("fn gemm(a: f32[128, 128], b: f32[128, 128]) -> f32[128, 128] { return a @ b; }")
    inputs = [(rand(128, 128), rand(128, 128)) for _ in range(4)]
    results = [None] * len(inputs)

    def work(k):
        a, b = inputs[k]
        for _ in range(5):
            results[k] = m(a, b)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (a, b), r in zip(inputs, results):
        np.testing.assert_allclose(r, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_bf16_results_stay_dlpack_tensors():
    m = dlc.compile("fn f(x: f32[4]) -> bf16[4] { return cast(x, bf16); }")
    (t,) = (m(np.array([1, 2, 3, 4], np.float32)),)
    assert isinstance(t, dlc.Tensor) and t.dtype == "bf16" and t.shape == (4,)


class DLPackOnly:
    """A tensor that offers nothing but DLPack (as PyTorch and JAX do)."""

    def __init__(self, array, versions=True):
        self.array = array
        self.versions = versions

    def __dlpack__(self, **kw):
        return self.array.__dlpack__(**kw) if self.versions else self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _interface(x):
    ai = x.__array_interface__
    return ai["data"][0], ai["typestr"], list(ai["shape"]), ai.get("strides")


def test_save_and_load_run_without_compiling(tmp_path, dense):
    x, w, b = rand(4, 8), rand(8, 3), rand(3)
    expected = dense(x, w, b)
    dense.save(tmp_path / "dense")
    files = sorted(os.listdir(tmp_path / "dense"))
    assert len(files) == 2 and files[0].startswith("module-") and files[0].endswith(".so")
    assert files[1] == "module.json"
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    loaded = dlc.load(tmp_path / "dense")
    assert loaded.signature == dense.signature and loaded.compile_stats == (0.0, 0, 0)
    np.testing.assert_array_equal(loaded(x, w, b), expected)
    np.testing.assert_array_equal(loaded.bind({"w": w, "b": b})(x), expected)
    with pytest.raises(ValueError, match="loaded from a saved module"):
        loaded.ir("graph")
    # Saving again replaces the saved module; a preparer travels with it.
    packed = dlc.compile(ROOT / "examples" / "language" / "weights.dl")
    packed.save(tmp_path / "dense")
    again = dlc.load(tmp_path / "dense")
    xs, ws, bs = rand(32, 256), rand(256, 128), rand(128)
    np.testing.assert_allclose(again.bind({"w": ws, "b": bs})(xs), packed(xs, ws, bs), rtol=1e-6)


def test_save_and_load_errors(tmp_path, dense):
    with pytest.raises(OSError, match="not a saved dlc module"):
        dlc.load(tmp_path / "nothing")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(OSError, match="is not a saved dlc module; not replaced"):
        dense.save(other)
    assert os.listdir(other) == ["keep.txt"]
    with pytest.raises(ValueError, match="save the module before bind"):
        dense.bind({"b": rand(3)}).save(tmp_path / "bound")
    dense.save(tmp_path / "m")
    meta = (tmp_path / "m" / "module.json").read_text()
    (tmp_path / "m" / "module.json").write_text(meta.replace('"version":1', '"version":99'))
    with pytest.raises(ValueError, match="version 99 of the format"):
        dlc.load(tmp_path / "m")
    (tmp_path / "m" / "module.json").write_text("{")
    with pytest.raises(ValueError, match="module.json: not JSON"):
        dlc.load(tmp_path / "m")
    (tmp_path / "m" / "module.json").write_text(meta.replace('"vector_bits":', '"vector_bits":4096,"x":'))
    with pytest.raises(ValueError, match="4096-bit vectors"):
        dlc.load(tmp_path / "m")
    (tmp_path / "m" / "module.json").write_text(meta)
    (library,) = [f for f in os.listdir(tmp_path / "m") if f.endswith(".so")]
    (tmp_path / "m" / library).write_bytes(b"not a library")
    with pytest.raises(ValueError, match=library):
        dlc.load(tmp_path / "m")


LOSS = """fn loss(x: f32[4, 3], y: f32[4, 2], weight w: f32[3, 2], weight b: f32[2]) -> f32 {
    return mse_loss(x @ w + b, y);
}"""


def test_gradients_of_an_entry_point():
    m = dlc.compile(LOSS)
    g = m.grad()
    assert [(p.name, p.shape) for p in g.outputs] == [("out0", ()), ("grad_w", (3, 2)), ("grad_b", (2,))]
    x, y, w, b = rand(4, 3), rand(4, 2), rand(3, 2), rand(2)
    value, gw, gb = g(x, y, w, b)
    x64, y64, w64, b64 = (a.astype(np.float64) for a in (x, y, w, b))
    d = x64 @ w64 + b64 - y64
    np.testing.assert_allclose(value, (d * d).mean(), rtol=1e-5)
    np.testing.assert_allclose(value, m(x, y, w, b), rtol=1e-6)
    np.testing.assert_allclose(gw, x64.T @ d * 2 / d.size, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gb, d.sum(axis=0) * 2 / d.size, rtol=1e-4, atol=1e-6)
    only_b = m.grad(wrt=["b"])
    np.testing.assert_allclose(only_b(x, y, w, b)[1], gb, rtol=1e-6)
    with pytest.raises(dlc.CompileError, match="nope"):
        m.grad(wrt=["nope"])
    with pytest.raises(ValueError, match="a gradient already"):
        g.grad()
    onnx = dlc.compile(ROOT / "tests" / "onnx" / "mlp" / "model.onnx")
    with pytest.raises(ValueError, match="imported ONNX model, whose program is not kept"):
        onnx.grad()


def test_a_training_step_is_an_entry_point(tmp_path):
    step = dlc.compile(ROOT / "examples" / "language" / "training.dl", entry="train_step")
    names = [p.name for p in step.inputs]
    assert names[:4] == ["x", "y", "w", "b"]
    args = {p.name: (rand(*p.shape) if p.dtype == "f32" else np.zeros(p.shape, np.int64)) for p in step.inputs}
    args["y"] = RNG.integers(0, 10, size=args["y"].shape)
    for state in ("mw", "vw", "mb", "vb"):
        args[state] = np.zeros_like(args[state])
    args["t"] = np.array(1, np.int64)
    loss, w2, b2, *_ = step(**args)
    plain = dlc.compile(ROOT / "examples" / "language" / "training.dl", entry="loss")
    np.testing.assert_allclose(loss, plain(args["x"], args["y"], args["w"], args["b"]), rtol=1e-6)
    assert w2.shape == args["w"].shape and not np.allclose(w2, args["w"])
    # A saved gradient keeps its results' names.
    g = plain.grad()
    g.save(tmp_path / "g")
    assert [p.name for p in dlc.load(tmp_path / "g").outputs] == ["out0", "grad_w", "grad_b"]


def test_calls_release_the_gil():
    # With forced switches turned off, the main thread can run while the
    # other thread is inside a call only if the call let go of the GIL.
    m = dlc.compile(ROOT / "examples" / "w1_gemm.dl", entry="gemm_1024")
    a, b = rand(1024, 1024), rand(1024, 1024)
    m(a, b)
    started, state = threading.Event(), {"done": False}

    def work():
        started.set()  # wakes the main thread, which then needs the GIL
        for _ in range(3):
            m(a, b)
        state["done"] = True

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        t = threading.Thread(target=work)
        t.start()
        started.wait()
        ran_during_call = not state["done"]
        t.join()
    finally:
        sys.setswitchinterval(interval)
    assert ran_during_call and state["done"]
