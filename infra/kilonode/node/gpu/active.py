"""The active GPU check: per GPU, a bf16 GEMM's throughput and correctness and a device copy's
bandwidth, through ctypes on the CUDA 11.8 libraries Debian ships in GPU images
(libcudart.so.11.0, libcublas.so.11). It yields the figures burn.json has, so
kilonode.gpu.rules judges both the same way.

The CUDA work runs in a child process (`python3 -m kilonode.gpu.active`, `measure` there),
never in the caller's: `run` starts it, bounds it by thresholds.toml [agent] active_timeout_s
and reads its one answer, JSON on its stdout. A CUDA error can be sticky for the process
that met it (cudaErrorSystemNotReady, 802, among them: CUDA initialised before Fabric Manager
has trained an NVSwitch fabric fails so for the rest of the process), and the agent is a
long-lived process: in it, one such error would fail every later check of the boot. In a
child it dies with the child, and the next try starts a fresh CUDA.

UNMEASURED ON A GPU: this ctypes path has not run on a GPU. Its floors (thresholds.toml,
models.<name>.cublas11, A100 and H100) are stated fractions of NVIDIA's published peaks, set
for cuBLAS 11 (no Hopper wgmma kernels); the PyTorch 2.11 (cu130) floor measured on the
fixtures' H100 applies to that stack only. Record the first GPU node's figures and re-set
the floors from them.

Signatures and enum values, from NVIDIA's headers:
- cuda_runtime_api.h: cudaGetDeviceCount(int*), cudaSetDevice(int), cudaMalloc(void**,
  size_t), cudaFree(void*), cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind),
  cudaMemset(void*, int, size_t), cudaDeviceSynchronize(void), cudaEventCreate(cudaEvent_t*),
  cudaEventRecord(cudaEvent_t, cudaStream_t), cudaEventSynchronize(cudaEvent_t),
  cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t), cudaEventDestroy(cudaEvent_t),
  cudaGetErrorString(cudaError_t) -> const char*; all return cudaError_t (int, 0 = success).
- driver_types.h: cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3.
- cublas_api.h: cublasCreate_v2(cublasHandle_t*), cublasDestroy_v2(cublasHandle_t),
  cublasGemmEx(handle, cublasOperation_t transa, transb, int m, n, k, const void* alpha,
  const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
  const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
  cublasGemmAlgo_t algo); CUBLAS_OP_N = 0; CUBLAS_COMPUTE_32F = 68; CUBLAS_GEMM_DEFAULT = -1;
  cublasStatus_t 0 = CUBLAS_STATUS_SUCCESS. With CUBLAS_COMPUTE_32F, alpha and beta are float.
- library_types.h: CUDA_R_32F = 0, CUDA_R_16BF = 14.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .rules import thresholds

# The floors in thresholds.toml are per stack: this check's figures are cuBLAS 11's.
STACK = "cublas11"
CUDART = ("libcudart.so.11.0", "libcudart.so")
CUBLAS = ("libcublas.so.11", "libcublas.so")
CUBLASLT = ("libcublasLt.so.11", "libcublasLt.so")

MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D = 1, 2, 3
CUBLAS_OP_N = 0
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

# The shape burn.json records (gemm_bf16_8192): 8192^3, 2*8192^3 FLOP per product.
SIZE = 8192
# Rows of the product checked against float64 (burn.json: a 256-row slice).
CHECK_ROWS = 256
# The fixtures' README: 5-10 s gives a stable figure (medians 657-659, p10 635-642).
GEMM_SECONDS = 8.0
COPY_BYTES = 1 << 30  # 1 GiB each way: long enough per copy that launch cost is noise
COPY_ROUNDS = 20

# cudaErrorSystemNotReady (driver_types.h) = CUDA_ERROR_SYSTEM_NOT_READY (cuda.h), 802: "the
# system is not yet ready to start any CUDA work". On an NVSwitch system (HGX) CUDA answers so
# at initialisation until Fabric Manager has trained the fabric, and the error stays with the
# process. The agent waits for nvidia-smi's fabric state before its first active check, but on
# A100 HGX (ND A100 v4, NVSwitch gen 2) nvidia-smi reports that state as N/A even with Fabric
# Manager running (bottlerocket-os/bottlerocket PR #3873, an 8x A100 p4d), so there this error
# is the only sign of a fabric still training: the caller (kilonode.gpu.agent) tries again
# until its fabric wait is up.
CUDA_ERROR_SYSTEM_NOT_READY = 802
# How long a killed child is waited for before it is left behind: one stuck in the driver
# (uninterruptible sleep) does not die of SIGKILL until the driver lets it go.
KILL_WAIT_S = 10
# The child's answer (JSON on its stdout): {"pid": ..., "burn": {...}} or {"pid": ...,
# "error": one of these, "message": ..., "code": the CUDA error or null}.
ANSWER_NOT_READY, ANSWER_CUDA, ANSWER_UNUSABLE = "not-ready", "cuda", "unusable"
# The import root the package sits in (the image's /usr/local/lib/kilonode/python for
# kilonode.gpu): the child imports this module from there as the parent did.
IMPORT_ROOT = Path(__file__).resolve().parents[(__package__ or "").count(".") + 1]


class Unusable(RuntimeError):
    """The active check could not run here (no CUDA libraries, no numpy): not a pass, and
    not a GPU fault either."""


class CudaFailure(Unusable):
    """A CUDA or cuBLAS call failed once the libraries were loaded: the GPU (or its driver)
    failed the check. `code`: the CUDA error (cudaError_t), when a CUDA call said one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class SystemNotReady(CudaFailure):
    """cudaErrorSystemNotReady (802) from CUDA's initialisation (cudaGetDeviceCount, which runs
    cuInit; cudaSetDevice; the context's creation): the NVSwitch fabric is not trained yet.
    Not a GPU fault while the fabric may still be training: the caller tries again in a new
    process until its fabric wait is up, then reports it as one."""


@dataclass
class _Libs:
    cudart: ctypes.CDLL
    cublas: ctypes.CDLL


def _load(names: tuple[str, ...]) -> ctypes.CDLL:
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as error:
            errors.append(str(error))
    raise Unusable(f"cannot load {names[0]} ({'; '.join(errors)}): the GPU image lacks the CUDA 11.8 libraries "
                   "(Debian packages libcudart11.0, libcublas11, libcublaslt11)")


def load_libraries() -> _Libs:
    _load(CUBLASLT)  # libcublas.so.11 needs it; loading it first names it when it is missing
    libs = _Libs(_load(CUDART), _load(CUBLAS))
    rt, bl = libs.cudart, libs.cublas
    void_p, size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    rt.cudaGetDeviceCount.argtypes = [ctypes.POINTER(c_int)]
    rt.cudaSetDevice.argtypes = [c_int]
    rt.cudaMalloc.argtypes = [ctypes.POINTER(void_p), size_t]
    rt.cudaFree.argtypes = [void_p]
    rt.cudaMemcpy.argtypes = [void_p, void_p, size_t, c_int]
    rt.cudaMemset.argtypes = [void_p, c_int, size_t]
    rt.cudaDeviceSynchronize.argtypes = []
    rt.cudaEventCreate.argtypes = [ctypes.POINTER(void_p)]
    rt.cudaEventRecord.argtypes = [void_p, void_p]
    rt.cudaEventSynchronize.argtypes = [void_p]
    rt.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), void_p, void_p]
    rt.cudaEventDestroy.argtypes = [void_p]
    rt.cudaGetErrorString.argtypes = [c_int]
    rt.cudaGetErrorString.restype = ctypes.c_char_p
    bl.cublasCreate_v2.argtypes = [ctypes.POINTER(void_p)]
    bl.cublasDestroy_v2.argtypes = [void_p]
    bl.cublasGemmEx.argtypes = [void_p, c_int, c_int, c_int, c_int, c_int, void_p, void_p, c_int, c_int,
                                void_p, c_int, c_int, void_p, void_p, c_int, c_int, c_int, c_int]
    return libs


def _cuda(libs: _Libs, result: int, what: str, init: bool = False) -> None:
    """Raise CudaFailure for a failed CUDA call; SystemNotReady for 802 from a call that
    initialises CUDA (`init`): from any other call it is a failure like the rest."""
    if result != 0:
        text = (libs.cudart.cudaGetErrorString(result) or b"?").decode()
        failure = SystemNotReady if init and result == CUDA_ERROR_SYSTEM_NOT_READY else CudaFailure
        raise failure(f"{what}: CUDA error {result} ({text})", result)


def _cublas(result: int, what: str) -> None:
    if result != 0:
        raise CudaFailure(f"{what}: cuBLAS status {result}")


def to_bf16_bits(values: Any) -> Any:
    """float32 array -> bf16 bit patterns (uint16), rounding to nearest even."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16_bits(bits: Any) -> Any:
    import numpy as np

    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def relative_error(product: Any, reference: Any) -> float:
    """Largest elementwise error over the largest reference magnitude (a normwise figure:
    elementwise relative errors blow up where the sum cancels to near zero)."""
    import numpy as np

    scale = float(np.max(np.abs(reference))) or 1.0
    return float(np.max(np.abs(product.astype(np.float64) - reference)) / scale)


class _Device:
    def __init__(self, libs: _Libs) -> None:
        self.libs = libs
        self.buffers: list[ctypes.c_void_p] = []

    def malloc(self, size: int) -> ctypes.c_void_p:
        pointer = ctypes.c_void_p()
        _cuda(self.libs, self.libs.cudart.cudaMalloc(ctypes.byref(pointer), size), f"cudaMalloc({size})")
        self.buffers.append(pointer)
        return pointer

    def free(self) -> None:
        for pointer in self.buffers:
            self.libs.cudart.cudaFree(pointer)
        self.buffers.clear()

    def event(self) -> ctypes.c_void_p:
        event = ctypes.c_void_p()
        _cuda(self.libs, self.libs.cudart.cudaEventCreate(ctypes.byref(event)), "cudaEventCreate")
        return event

    def elapsed_ms(self, start: ctypes.c_void_p, stop: ctypes.c_void_p) -> float:
        _cuda(self.libs, self.libs.cudart.cudaEventSynchronize(stop), "cudaEventSynchronize")
        ms = ctypes.c_float()
        _cuda(self.libs, self.libs.cudart.cudaEventElapsedTime(ctypes.byref(ms), start, stop), "cudaEventElapsedTime")
        return ms.value


def check_gpu(libs: _Libs, index: int, seconds: float = GEMM_SECONDS) -> dict[str, Any]:
    """burn.json's figures for one GPU."""
    import numpy as np

    rt = libs.cudart
    _cuda(libs, rt.cudaSetDevice(index), f"cudaSetDevice({index})", init=True)
    # cudaFree(NULL) creates the device's primary context (CUDA 11's cudaSetDevice does not):
    # a fabric not yet trained says 802 here, not as cuBLAS's CUBLAS_STATUS_NOT_INITIALIZED
    _cuda(libs, rt.cudaFree(None), f"cudaFree(NULL) (context creation on GPU {index})", init=True)
    device = _Device(libs)
    handle = ctypes.c_void_p()
    _cublas(libs.cublas.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate_v2")
    try:
        rng = np.random.default_rng(index)
        a = to_bf16_bits(rng.standard_normal((SIZE, SIZE), dtype=np.float32))
        b = to_bf16_bits(rng.standard_normal((SIZE, SIZE), dtype=np.float32))
        nbytes = SIZE * SIZE * 2
        da, db, dc = device.malloc(nbytes), device.malloc(nbytes), device.malloc(nbytes)
        _cuda(libs, rt.cudaMemcpy(da, a.ctypes.data, nbytes, MEMCPY_H2D), "cudaMemcpy A")
        _cuda(libs, rt.cudaMemcpy(db, b.ctypes.data, nbytes, MEMCPY_H2D), "cudaMemcpy B")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

        def gemm() -> None:
            # Row-major C = A B is column-major C^T = B^T A^T: pass B first, no transposes.
            _cublas(libs.cublas.cublasGemmEx(
                handle, CUBLAS_OP_N, CUBLAS_OP_N, SIZE, SIZE, SIZE, ctypes.byref(alpha),
                db, CUDA_R_16BF, SIZE, da, CUDA_R_16BF, SIZE, ctypes.byref(beta),
                dc, CUDA_R_16BF, SIZE, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx")

        start, stop = device.event(), device.event()
        flop = 2.0 * SIZE ** 3
        tflops: list[float] = []
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            _cuda(libs, rt.cudaEventRecord(start, None), "cudaEventRecord")
            gemm()
            _cuda(libs, rt.cudaEventRecord(stop, None), "cudaEventRecord")
            tflops.append(flop / (device.elapsed_ms(start, stop) / 1e3) / 1e12)
        wall = time.monotonic() - began
        c = np.empty((SIZE, SIZE), dtype=np.uint16)
        _cuda(libs, rt.cudaMemcpy(c.ctypes.data, dc, nbytes, MEMCPY_D2H), "cudaMemcpy C")
        reference = from_bf16_bits(a[:CHECK_ROWS]).astype(np.float64) @ from_bf16_bits(b).astype(np.float64)
        error = relative_error(from_bf16_bits(c[:CHECK_ROWS]), reference)
        device.free()

        src, dst = device.malloc(COPY_BYTES), device.malloc(COPY_BYTES)
        _cuda(libs, rt.cudaMemset(src, 1, COPY_BYTES), "cudaMemset")
        _cuda(libs, rt.cudaMemcpy(dst, src, COPY_BYTES, MEMCPY_D2D), "cudaMemcpy D2D (warm-up)")
        _cuda(libs, rt.cudaEventRecord(start, None), "cudaEventRecord")
        for _ in range(COPY_ROUNDS):
            _cuda(libs, rt.cudaMemcpy(dst, src, COPY_BYTES, MEMCPY_D2D), "cudaMemcpy D2D")
        _cuda(libs, rt.cudaEventRecord(stop, None), "cudaEventRecord")
        copy_s = device.elapsed_ms(start, stop) / 1e3
        rt.cudaEventDestroy(start)
        rt.cudaEventDestroy(stop)
        return {
            "index": index,
            "gemm_bf16_8192": {
                "iters": len(tflops),
                "tflops_min": min(tflops),
                "tflops_median": statistics.median(tflops),
                "tflops_max": max(tflops),
                "seconds": wall,
            },
            "gemm_bf16_max_rel_error_vs_fp64": error,
            # bytes read plus written, as burn.json counts them
            "d2d_copy_TBps_read_plus_write": 2 * COPY_BYTES * COPY_ROUNDS / copy_s / 1e12,
        }
    finally:
        device.free()
        libs.cublas.cublasDestroy_v2(handle)


def measure(model: str, seconds: float = GEMM_SECONDS) -> dict[str, Any]:
    """burn.json for every GPU: {"device": model, "tool": ..., "gpus": [per GPU]}, measured in
    this process (the child's side of `run`). Raises Unusable when it cannot run, CudaFailure
    when a CUDA call fails, SystemNotReady for 802 at CUDA's initialisation."""
    libs = load_libraries()
    try:
        import numpy  # noqa: F401 - the correctness reference needs it (Debian python3-numpy)
    except ImportError:
        raise Unusable("numpy is missing (Debian package python3-numpy): the correctness check needs it") from None
    count = ctypes.c_int()
    # the runtime's first call runs cuInit: where an untrained fabric says 802
    _cuda(libs, libs.cudart.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount", init=True)
    if count.value < 1:
        raise CudaFailure("cudaGetDeviceCount found no GPU")
    return {
        "tool": "kilonode.gpu.active (ctypes, cuBLAS 11)",
        "stack": STACK,
        "device": model,
        "gpus": [check_gpu(libs, index, seconds) for index in range(count.value)],
    }


def child_command(model: str, seconds: float) -> list[str]:
    """The child's command line: this interpreter (Debian's python3 on a node) with the flags
    that shape its imports (-S: the tests' standard library alone), this module as `-m`."""
    flags = [flag for flag, on in (("-S", sys.flags.no_site), ("-s", sys.flags.no_user_site)) if on]
    return [sys.executable, *flags, "-m", f"{__package__}.active", "--model", model, "--seconds", repr(seconds)]


def run(model: str, seconds: float = GEMM_SECONDS, timeout_s: float | None = None) -> dict[str, Any]:
    """burn.json for every GPU, measured in a child process (`measure` there), which is killed
    after `timeout_s` (default: thresholds.toml [agent] active_timeout_s). Raises what
    `measure` raised in the child (Unusable, CudaFailure, SystemNotReady); CudaFailure for a
    child that ran out of time or died of a signal (a GPU or its driver hung or crashed it);
    Unusable for one that exited without an answer."""
    if timeout_s is None:
        timeout_s = float(thresholds()["agent"]["active_timeout_s"])
    pid, returncode, out, err = run_child(child_command(model, seconds), timeout_s, "the active check",
                                          "active_timeout_s")
    return _answer(pid, returncode, out, err)


def run_child(command: list[str], timeout_s: float, what: str, timeout_key: str) -> tuple[int, int, str, str]:
    """Run a child whose CUDA work must not touch this process (this module's, or
    kilonode.gpu.gpudirect's), with this package's import root on its PYTHONPATH, killed after
    `timeout_s`. Returns its pid, exit status, stdout and stderr (its stderr is also copied to
    this process's, for the journal). Raises Unusable when it cannot start, CudaFailure when it
    ran out of time (`what` and `timeout_key` name the check and its bound in the message)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
    except OSError as error:
        raise Unusable(f"{what}'s process cannot start: {error}") from None
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        try:
            out, err = child.communicate(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            out, err = "", ""  # stuck in the driver: left behind, still a fault
        sys.stderr.write(err or "")
        raise CudaFailure(f"{what} did not finish within {timeout_s:g} s ({timeout_key}): its "
                          f"process (pid {child.pid}) was killed; a GPU or its driver hung") from None
    sys.stderr.write(err)  # the child's own log, for the journal
    return child.pid, child.returncode, out, err


def _answer(pid: int, returncode: int, out: str, err: str, key: str = "burn",
            what: str = "the active check") -> dict[str, Any]:
    """The child's answer: its `key` object, or what it raised (see `main`)."""
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        if returncode < 0:
            name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
            raise CudaFailure(f"{what}'s process (pid {pid}) was killed by {name} before it answered")
        last = " | ".join(err.strip().splitlines()[-3:]) or "nothing on stderr"
        raise Unusable(f"{what}'s process (pid {pid}) exited {returncode} without an answer: {last}")
    kind, message = answer.get("error"), str(answer.get("message", ""))
    code = answer.get("code") if isinstance(answer.get("code"), int) else None
    if kind is None and isinstance(answer.get(key), dict):
        return answer[key]
    if kind == ANSWER_NOT_READY:
        raise SystemNotReady(message, code)
    if kind == ANSWER_CUDA:
        raise CudaFailure(message, code)
    raise Unusable(message or f"{what}'s process (pid {pid}) answered {out.strip()[:200]!r}")


def main(argv: list[str] | None = None) -> int:
    """The child: measure, answer on stdout (one JSON object), exit 0. An error not of the
    check's own kinds is a traceback on stderr and exit 1 (the parent: Unusable)."""
    parser = argparse.ArgumentParser(prog="python3 -m kilonode.gpu.active", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--seconds", type=float, default=GEMM_SECONDS)
    args = parser.parse_args(argv)
    answer_fd = answer_channel()
    answer: dict[str, Any]
    try:
        answer = {"burn": measure(args.model, args.seconds)}
    except SystemNotReady as error:
        answer = {"error": ANSWER_NOT_READY, "message": str(error), "code": error.code}
    except CudaFailure as error:
        answer = {"error": ANSWER_CUDA, "message": str(error), "code": error.code}
    except Unusable as error:
        answer = {"error": ANSWER_UNUSABLE, "message": str(error), "code": None}
    return send_answer(answer_fd, answer)


def answer_channel() -> int:
    """A child's answer channel: stdout carries the answer alone, and whatever else writes to it (a
    library) goes to stderr. Returns the descriptor send_answer writes to."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    return answer_fd


def send_answer(answer_fd: int, answer: dict[str, Any]) -> int:
    """Write a child's answer, with its pid, as JSON to the channel; the exit status (0)."""
    answer["pid"] = os.getpid()
    with os.fdopen(answer_fd, "w") as out:
        json.dump(answer, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
