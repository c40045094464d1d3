"""Where the codec's float64 linear algebra runs: one backend object, chosen by the caller.

The decoder (codec/decoder.py), the encoder (codec/encoder.py) and its simulation of the
decoder (codec/simulate.py) are written once against `Linalg`:

  * `NumpyLinalg()`: the reference (SPEC.md 7.5): numpy on the CPU, LAPACK dsyevd on the
    lower triangle, one BLAS thread. `NumpyLinalg(solver, blas_threads)` swaps the
    eigensolver or the thread count, for cross-reader tests.
  * `TorchLinalg(device)`: torch float64 on any torch device ("cpu", "cuda", "cuda:1").

Arrays a backend returns are its own (numpy arrays or torch tensors on its device) and stay
there between steps; `host()` and `block()` bring back what must come back.

Nothing is ever rounded to an element dtype here. Every value that is rounded comes back to
the host in float64 and is rounded by codec/dtypes.f64_to_bits (SPEC.md 7.4): torch's own
float64 -> float16 / bfloat16 conversion goes through float32 and rounds twice.

`device_backend(spec)` turns what a user types (`--device`) into a backend:
  cpu                  the reference (NumpyLinalg)
  cuda, cuda:N         torch on that GPU
  torch:DEV            torch on any torch device, e.g. torch:cpu (the GPU code path, on the CPU)
  numpy:SOLVER[:T]     the numpy backend with another eigensolver (numpy, numpy-upper, scipy-evd,
                       scipy-evr, scipy-ev) and T BLAS threads (a number, or "unpinned")
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from time import perf_counter
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceError, InputError, check_choice
from . import host_native, rotation as rot
from .dtypes import RawTensor

Array = Any  # a backend's own array: numpy.ndarray or torch.Tensor


class EigenFailure(Exception):
    """The eigensolver did not converge (the decoder then uses NaN eigenvectors, SPEC.md 7.5)."""


class Linalg(Protocol):
    """The float64 linear algebra of the codec. `name` is the device spec it was made from."""

    name: str
    is_reference: bool

    def threads(self) -> AbstractContextManager[object]: ...  # around a whole encode or decode
    def guard(self) -> AbstractContextManager[object]: ...  # device failures -> DeviceError
    def widen(self, t: RawTensor) -> Array: ...  # the tensor's exact float64 values, on the device
    def asarray(self, x: np.ndarray) -> Array: ...
    def host(self, a: Array) -> np.ndarray: ...  # float64 on the host
    def axis_matrix(self, a: Array, axis: int) -> Array: ...
    def from_axis_matrix(self, m: Array, shape: tuple[int, ...], axis: int) -> Array: ...
    def gram(self, m: Array) -> Array: ...
    def eigh(self, g: Array) -> tuple[Array, Array]: ...  # raises EigenFailure
    def eigh_second(self, g: Array) -> tuple[Array, Array]: ...  # another reduction (the encoder's band)
    def all_finite(self, a: Array) -> bool: ...
    def nan_square(self, d: int) -> Array: ...
    def matmul(self, a: Array, b: Array) -> Array: ...
    def rotate(self, x: Array, axis: int, r: Array) -> Array: ...  # x with axis `axis` multiplied by r
    def regenerate(self, e: Array, mu: Array, paper: bool) -> Array: ...
    def block(self, x: Array) -> np.ndarray: ...  # symmetric X -> host float64 block (SPEC.md 7.3 order)
    def from_block(self, values: np.ndarray, d: int) -> Array: ...
    def column_sums(self, e: Array) -> np.ndarray: ...
    def flip_columns(self, e: Array, flip: np.ndarray) -> Array: ...
    def max_abs(self, a: Array) -> float: ...
    def max_row_norm(self, m: Array) -> float: ...


def apply_paper_signs(la: Linalg, e: Array, negative: np.ndarray) -> Array:
    """Alg. 2 on any backend: flip each recovered eigenvector (column of E) to the stored sign."""
    return la.flip_columns(e, (la.column_sums(e) < 0) != negative)


def solve(la: Linalg, g: Array, second: bool = False) -> Array | None:
    """The eigenvectors of g, or None if g is not finite or the eigensolver fails."""
    if not la.all_finite(g):
        return None
    try:
        return (la.eigh_second if second else la.eigh)(g)[1]
    except EigenFailure:
        return None


def _scipy(driver: str) -> rot.Eigensolver:
    def solve_(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import scipy.linalg  # type: ignore[import-untyped]  # testing only: not a dependency

        w, v = scipy.linalg.eigh(a, driver=driver, check_finite=False)
        return w, v

    return solve_


# The numpy backend's eigensolvers: the reference, and others SPEC.md 7.5 allows (cross-reader tests).
NUMPY_SOLVERS: dict[str, rot.Eigensolver] = {
    "numpy": rot.eigh,
    "numpy-upper": rot.eigh_upper,
    "scipy-evd": _scipy("evd"),
    "scipy-evr": _scipy("evr"),
    "scipy-ev": _scipy("ev"),
}


class NumpyLinalg:
    """numpy on the CPU. The defaults are the reference: numpy's eigh and one BLAS thread
    (eigenvectors of a nearly degenerate matrix depend on how LAPACK splits its work).
    blas_threads: a count, or None for whatever the process has ("unpinned")."""

    def __init__(self, solver: str = "numpy", blas_threads: int | None = 1) -> None:
        check_choice("eigensolver", solver, list(NUMPY_SOLVERS))
        if blas_threads is not None and blas_threads < 1:
            raise InputError(f"BLAS threads must be at least 1, not {blas_threads}")
        self._eigh = NUMPY_SOLVERS[solver]
        self.solver, self.blas_threads = solver, blas_threads
        self.is_reference = solver == "numpy" and blas_threads == 1
        threads = "" if blas_threads == 1 else f":{blas_threads or 'unpinned'}"
        self.name = "cpu" if self.is_reference else f"numpy:{solver}{threads}"  # device_backend(name) makes it again

    def threads(self) -> AbstractContextManager[object]:
        return nullcontext() if self.blas_threads is None else rot.blas_threads(self.blas_threads)

    def guard(self) -> AbstractContextManager[object]:
        return nullcontext()

    def widen(self, t: RawTensor) -> np.ndarray:
        return t.to_f64()

    def asarray(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    def host(self, a: np.ndarray) -> np.ndarray:
        return a

    def axis_matrix(self, a: np.ndarray, axis: int) -> np.ndarray:
        return rot.axis_matrix(a, axis)

    def from_axis_matrix(self, m: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
        return rot.from_axis_matrix(m, shape, axis)

    def gram(self, m: np.ndarray) -> np.ndarray:
        return rot.gram(m)

    def eigh(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._call_eigh(self._eigh, g)

    def eigh_second(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._call_eigh(rot.eigh_upper, g)

    @staticmethod
    def _call_eigh(fn: rot.Eigensolver, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        try:
            return fn(g)
        except np.linalg.LinAlgError as exc:
            raise EigenFailure(str(exc)) from None

    def all_finite(self, a: np.ndarray) -> bool:
        if host_native.active() and a.dtype == np.float64:
            return host_native.all_finite(a)
        return bool(np.all(np.isfinite(a)))

    def nan_square(self, d: int) -> np.ndarray:
        return np.full((d, d), np.nan)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out: np.ndarray = a @ b
        return out

    def rotate(self, x: np.ndarray, axis: int, r: np.ndarray) -> np.ndarray:
        return rot.rotate_axis(x, axis, r)

    def regenerate(self, e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
        return rot.regenerate(e, mu, paper)

    def block(self, x: np.ndarray) -> np.ndarray:
        return rot.matrix_to_block(x)

    def from_block(self, values: np.ndarray, d: int) -> np.ndarray:
        return rot.block_to_matrix(values, d)

    def column_sums(self, e: np.ndarray) -> np.ndarray:
        out: np.ndarray = e.sum(axis=0)
        return out

    def flip_columns(self, e: np.ndarray, flip: np.ndarray) -> np.ndarray:
        out: np.ndarray = e * np.where(flip, -1.0, 1.0)
        return out

    def max_abs(self, a: np.ndarray) -> float:
        return float(np.max(np.abs(a), initial=0.0))

    def max_row_norm(self, m: np.ndarray) -> float:
        return float(np.sqrt(np.max(np.einsum("ij,ij->i", m, m), initial=0.0)))


REFERENCE = NumpyLinalg()

_TORCH_VIEW = {"float16": ("int16", "float16"), "bfloat16": ("int16", "bfloat16"), "float32": ("int32", "float32")}


class TorchLinalg:
    """torch float64 on one torch device. Made only for a device that works: a missing GPU,
    a device without float64, or torch without that device's support is DeviceError here,
    before any output exists."""

    is_reference = False

    def __init__(self, device: str = "cpu") -> None:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            raise DeviceError(f"device {device!r} needs torch, which is not installed") from None
        self._torch = torch
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise InputError(f"unknown device {device!r}: {exc}") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise DeviceError(f"device {device!r}: no CUDA GPU is available to this process"
                                  + ("" if torch.version.cuda else " (this torch was built without CUDA)"))
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise DeviceError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.name = str(dev) if dev.type != "cpu" else "torch:cpu"
        self._masks: dict[int, Any] = {}
        with self.guard():
            try:  # the device must run float64 eigh at all (mps, for one, has no float64)
                torch.linalg.eigh(torch.eye(2, dtype=torch.float64, device=dev))
            except (RuntimeError, TypeError, NotImplementedError) as exc:
                raise DeviceError(f"device {device!r} cannot run float64 linear algebra: {str(exc).splitlines()[0]}") from None

    # -- bookkeeping -------------------------------------------------------------------------

    def threads(self) -> AbstractContextManager[object]:
        """The host's numpy BLAS on one thread, as for the reference (the encoder's host-side
        products, e.g. calibration moments, then do not depend on the thread count)."""
        return rot.one_blas_thread()

    @contextmanager
    def guard(self) -> Iterator[None]:
        """torch's out-of-memory and device errors become DeviceError (E_DEVICE), one line."""
        torch = self._torch
        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise DeviceError(f"out of memory on {self.device}: {str(exc).splitlines()[0]}") from None
        except RuntimeError as exc:
            text = str(exc)
            if "CUDA" in text or "cuda" in text or "device-side" in text:
                raise DeviceError(f"{self.device} failed: {text.splitlines()[0]}") from None
            raise

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """fn(), reported to an active rotation.linalg_clock (the device synchronized first)."""
        if not rot.clock_active():
            return fn()
        t0 = perf_counter()
        out = fn()
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)
        rot.record(name, t0)
        return out

    # -- moving values -----------------------------------------------------------------------

    def widen(self, t: RawTensor) -> Any:
        """Upload the bit patterns as they are (2 or 4 bytes a value) and widen on the device:
        float16 / bfloat16 / float32 -> float64 is exact on every IEEE device."""
        torch = self._torch
        ints, floats = _TORCH_VIEW[t.dtype]
        bits = np.ascontiguousarray(t.bits).view(np.dtype(ints))
        if not bits.flags.writeable:  # a view of a payload read from the file: torch wants its own
            bits = bits.copy()
        dev = torch.from_numpy(bits).to(self.device)
        return dev.view(getattr(torch, floats)).to(torch.float64)

    def asarray(self, x: np.ndarray) -> Any:
        x = np.ascontiguousarray(x, dtype=np.float64)
        return self._torch.from_numpy(x if x.flags.writeable else x.copy()).to(self.device)

    def host(self, a: Any) -> np.ndarray:
        out: np.ndarray = a.detach().to("cpu").numpy()
        return out

    # -- arithmetic --------------------------------------------------------------------------

    def axis_matrix(self, a: Any, axis: int) -> Any:
        return self._torch.movedim(a, axis, -1).reshape(-1, a.shape[axis])

    def from_axis_matrix(self, m: Any, shape: tuple[int, ...], axis: int) -> Any:
        moved = list(shape)
        d = moved.pop(axis)
        moved.append(d)
        return self._torch.movedim(m.reshape(moved), -1, axis)

    def gram(self, m: Any) -> Any:
        return self._timed("gram", lambda: m.T @ m)

    def eigh(self, g: Any) -> tuple[Any, Any]:
        w, v = self._timed("eigh", lambda: self._eigh(g, "L"))
        return w, v

    def eigh_second(self, g: Any) -> tuple[Any, Any]:
        w, v = self._timed("eigh_upper", lambda: self._eigh(g, "U"))
        return w, v

    def _eigh(self, g: Any, uplo: str) -> tuple[Any, Any]:
        torch = self._torch
        try:
            w, v = torch.linalg.eigh(g, UPLO=uplo)
        except torch.linalg.LinAlgError as exc:
            raise EigenFailure(str(exc)) from None
        return w, v

    def all_finite(self, a: Any) -> bool:
        if self._compiled_host(a):  # one pass over the memory, no boolean temporary
            return host_native.all_finite(self.host(a))
        return bool(self._torch.isfinite(a).all())

    def _compiled_host(self, a: Any) -> bool:
        """Whether a (a float64 tensor) is in host memory that host_native can read in place."""
        return self.device.type == "cpu" and host_native.active() and a.dtype == self._torch.float64

    def nan_square(self, d: int) -> Any:
        return self._torch.full((d, d), float("nan"), dtype=self._torch.float64, device=self.device)

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def rotate(self, x: Any, axis: int, r: Any) -> Any:
        return self._timed("rotate_axis", lambda: self.from_axis_matrix(self.axis_matrix(x, axis) @ r, tuple(x.shape), axis))

    def regenerate(self, e: Any, mu: Any, paper: bool) -> Any:
        return self._timed("regenerate", lambda: (e.T * mu) @ e if paper else (e * mu) @ e.T)

    def _upper(self, d: int) -> Any:
        """The strict upper triangle of a d x d matrix as a boolean mask (cached per d): boolean
        indexing reads it row-major, the block's order."""
        mask = self._masks.get(d)
        if mask is None:
            mask = self._torch.ones((d, d), dtype=self._torch.bool, device=self.device).triu_(1)
            self._masks = {d: mask}  # one size at a time: a model's sites come in few sizes, in runs
        return mask

    def block(self, x: Any) -> np.ndarray:
        if self._compiled_host(x):  # one copy, not a mask's gather and a concatenation
            return rot.matrix_to_block(self.host(x))
        d = x.shape[0]
        return self.host(self._torch.cat([x.diagonal(), x[self._upper(d)]]))

    def from_block(self, values: np.ndarray, d: int) -> Any:
        torch = self._torch
        v = self.asarray(values)
        x = torch.zeros((d, d), dtype=torch.float64, device=self.device)
        x[self._upper(d)] = v[d:]
        x = x + x.T  # each off-diagonal value plus an exact 0
        x.diagonal().copy_(v[:d])
        return x

    def column_sums(self, e: Any) -> np.ndarray:
        return self.host(e.sum(dim=0))

    def flip_columns(self, e: Any, flip: np.ndarray) -> Any:
        sign = self._torch.from_numpy(np.where(flip, -1.0, 1.0)).to(self.device)
        return e * sign

    def max_abs(self, a: Any) -> float:
        return float(a.abs().max()) if a.numel() else 0.0

    def max_row_norm(self, m: Any) -> float:
        return float((m * m).sum(dim=1).max().sqrt()) if m.numel() else 0.0


def device_backend(spec: "str | Linalg | None") -> Linalg:
    """The backend for a device spec (module docstring), or `spec` itself if it is a backend.
    None and "cpu" are the reference."""
    if spec is None or spec == "cpu":
        return REFERENCE
    if not isinstance(spec, str):
        return spec
    if spec == "cuda" or spec.startswith("cuda:"):
        return TorchLinalg(spec)
    if spec.startswith("torch:"):
        return TorchLinalg(spec[len("torch:"):])
    if spec == "numpy" or spec.startswith("numpy:"):
        parts = spec.split(":")[1:]
        solver = parts[0] if parts else "numpy"
        threads: int | None = 1
        if len(parts) > 1:
            threads = None if parts[1] == "unpinned" else _positive(parts[1], spec)
        if len(parts) > 2:
            raise InputError(f"unknown device {spec!r} (numpy:SOLVER[:THREADS])")
        return NumpyLinalg(solver, threads)
    raise InputError(f"unknown device {spec!r} (choose cpu, cuda, cuda:N, torch:DEVICE or numpy:SOLVER[:THREADS])")


def _positive(text: str, spec: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"device {spec!r}: BLAS threads must be a positive integer or 'unpinned'")
    return n


def torch_device_of(la: Linalg) -> str:
    """Where tensors decoded with `la` are put for the caller: its torch device, else the CPU."""
    dev = getattr(la, "device", None)
    return "cpu" if dev is None else str(dev)
