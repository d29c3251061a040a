"""The active GPU check: per GPU, a bf16 GEMM's throughput and correctness and a device copy's
bandwidth, through ctypes on the CUDA 11.8 libraries Debian ships in GPU images
(libcudart.so.11.0, libcublas.so.11). It yields the figures burn.json has, so
kilonode.gpu.rules judges both the same way.

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

import ctypes
import statistics
import time
from dataclasses import dataclass
from typing import Any

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


class Unusable(RuntimeError):
    """The active check could not run here (no CUDA libraries, no numpy): not a pass, and
    not a GPU fault either."""


class CudaFailure(Unusable):
    """A CUDA or cuBLAS call failed once the libraries were loaded: the GPU (or its driver)
    failed the check."""


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


def _cuda(libs: _Libs, result: int, what: str) -> None:
    if result != 0:
        text = (libs.cudart.cudaGetErrorString(result) or b"?").decode()
        raise CudaFailure(f"{what}: CUDA error {result} ({text})")


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
    _cuda(libs, rt.cudaSetDevice(index), f"cudaSetDevice({index})")
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


def run(model: str, seconds: float = GEMM_SECONDS) -> dict[str, Any]:
    """burn.json for every GPU: {"device": model, "tool": ..., "gpus": [per GPU]}. Raises
    Unusable when it cannot run."""
    libs = load_libraries()
    try:
        import numpy  # noqa: F401 - the correctness reference needs it (Debian python3-numpy)
    except ImportError:
        raise Unusable("numpy is missing (Debian package python3-numpy): the correctness check needs it") from None
    count = ctypes.c_int()
    _cuda(libs, libs.cudart.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
    if count.value < 1:
        raise CudaFailure("cudaGetDeviceCount found no GPU")
    return {
        "tool": "kilonode.gpu.active (ctypes, cuBLAS 11)",
        "stack": STACK,
        "device": model,
        "gpus": [check_gpu(libs, index, seconds) for index in range(count.value)],
    }
