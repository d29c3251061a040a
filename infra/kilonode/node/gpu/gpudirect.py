"""The GPUDirect RDMA probe: can each InfiniBand HCA register each GPU's memory through
DMA-BUF, the path NCCL takes on kilonode's InfiniBand pools (Debian's open NVIDIA kernel
module; no nvidia-peermem). Run by the agent (kilonode.gpu.agent) with the active check, on
nodes whose config says "expectGpuDirectRdma": true; it writes gpudirect.json
(kilonode.gpu.readings) and kilonode.gpu.rules judges it.

Per GPU (CUDA driver API, libcuda.so.1, through ctypes): CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, a 2 MiB cuMemAlloc, its page-aligned range exported as a dma-buf fd with
cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD). Per InfiniBand HCA
(libibverbs.so.1): ibv_open_device, ibv_alloc_pd. Then every GPU's dma-buf is registered on
every HCA with ibv_reg_dmabuf_mr(pd, 0, length, iova, fd, LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ),
NCCL's access flags, and deregistered; everything is freed. Every GPU on every HCA, not each
GPU on its topology neighbour: NCCL may use any HCA for any GPU (PXN, rails, a topology file
the job sets), the pairing would have to be read from a topology file per size, and 8 x 8
registrations of 2 MiB take milliseconds. A step that fails is a failure naming the GPU
(CUDA ordinal in PCI bus order, and its bus id), the HCA, the call and its CUresult or errno.

Why each step: NCCL 2.18 uses GPUDirect RDMA at all only for a GPU whose CUDA says
cudaDevAttrGPUDirectRDMASupported (the runtime's name for CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED):
each rank asks it once (NVIDIA/nccl v2.18.3-1 src/net.cc:291-302, ncclGpuGdrSupport, called from
src/init.cc:476 into its peer info), the topology records it per GPU (src/graph/topo.cc:623, the
GPU's "gdr" attribute), and a GPU without it gets no GPUDirect path to any HCA
(src/graph/paths.cc:358, ncclTopoCheckGdr), whatever DMA-BUF says: every transfer is staged. It
uses DMA-BUF when the GPU says CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
(NVIDIA/nccl v2.18.3-1 src/init.cc:255-270, dmaBufSupported) and ibv_reg_dmabuf_mr on the
HCA does not fail with EOPNOTSUPP or EPROTONOSUPPORT for fd -1 (src/transport/net_ib.cc:297-315,
ncclIbDmaBufSupport; src/misc/ibvwrap.cc:158-164 sets EOPNOTSUPP when libibverbs lacks the
symbol, IBVERBS_1.12, src/misc/ibvsymbols.cc:115-116); it exports each buffer with
cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
(src/transport/net.cc:674) and registers it with ibv_reg_dmabuf_mr(pd, offset, length, addr,
fd, LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ) (src/transport/net_ib.cc:888-904). Otherwise it
stages every transfer through host memory, silently. This probe makes the registration for
real (a valid fd), so it also fails where NCCL's fd -1 test would pass and the real
registration not (the HCA's provider, on-demand paging, the GPU's export).

The InfiniBand HCAs are the devices libibverbs lists whose port 1 link layer
(/sys/class/infiniband/<dev>/ports/1/link_layer) is not Ethernet: Azure's
accelerated-networking NIC (mlx5, Ethernet) is listed too, and gang pods never get it (the
RDMA device plugin selects linkTypes infiniband). None left is a failure: the RDMA stack,
ib_uverbs or the HCAs (SR-IOV virtual functions) are missing.

The work runs in a child process (`python3 -m kilonode.gpu.gpudirect`), as the active check's
does (kilonode.gpu.active): a sticky CUDA error dies with it. libibverbs is loaded there only,
and only on nodes whose config asks for the probe.

UNMEASURED ON A GPU OR AN HCA: this ctypes path has run against fakes only
(tests/node/gpu/test_gpudirect.py). Signatures and values:
- cuda.h (CUDA 11.7+): cuInit(unsigned), cuDeviceGetCount(int*), cuDeviceGet(CUdevice*, int),
  cuDeviceGetPCIBusId(char*, int, CUdevice), cuDeviceGetAttribute(int*, CUdevice_attribute,
  CUdevice), cuDevicePrimaryCtxRetain(CUcontext*, CUdevice), cuDevicePrimaryCtxRelease (the
  exported cuDevicePrimaryCtxRelease_v2)(CUdevice), cuCtxSetCurrent(CUcontext), cuMemAlloc
  (cuMemAlloc_v2)(CUdeviceptr*, size_t), cuMemFree (cuMemFree_v2)(CUdeviceptr),
  cuMemGetHandleForAddressRange(void* handle, CUdeviceptr, size_t, CUmemRangeHandleType,
  unsigned long long flags), cuGetErrorName(CUresult, const char**); CUresult 0 = success;
  CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116 (CUDA 11.3+; read in NVIDIA/cuda-python
  0d447659 cuda/ccuda.pxd, its CUdevice_attribute_enum generated from cuda.h);
  CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124; CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1. The
  range must be aligned to the host page size (linux-rdma/perftest v4.5-0.20
  src/perftest_resources.c:1803-1816 aligns it so).
- rdma-core libibverbs/verbs.h and libibverbs.map.in (v34.0, Debian bookworm has v44):
  ibv_get_device_list(int*), ibv_free_device_list, ibv_get_device_name, ibv_open_device,
  ibv_close_device, ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr (IBVERBS_1.1),
  ibv_reg_dmabuf_mr(pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access)
  (IBVERBS_1.12, new in rdma-core v34); NULL (or non-zero) and errno on failure;
  IBV_ACCESS_LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4. The structs are opaque pointers here.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import sys
from pathlib import Path
from typing import Any

from . import active
from .rules import thresholds

LIBCUDA = "libcuda.so.1"  # the driver's (Debian libcuda1), not the CUDA 11.8 runtime
LIBIBVERBS = "libibverbs.so.1"  # Debian libibverbs1 (rdma-core)
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1
# NCCL's flags for its buffers (net_ib.cc:900), without relaxed ordering (an optional extra)
IBV_ACCESS = 1 | 2 | 4  # IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
BUFFER_BYTES = 2 << 20  # 2 MiB: one large GPU page; the registration pins it, so small
SYS_INFINIBAND = Path("/sys/class/infiniband")
# What a failure is about (gpudirect.json "failures"[].kind; kilonode.gpu.rules names the rules)
KIND_UNAVAILABLE = "unavailable"  # a step failed on a GPU, an HCA or a pair of them
KIND_NO_HCA = "no-hca"  # no InfiniBand device at all
KIND_UNVERIFIED = "unverified"  # the probe itself did not answer (hung, killed, crashed)
TOOL = "kilonode.gpu.gpudirect (ctypes, libcuda.so.1, libibverbs.so.1)"


def failure(kind: str, call: str, message: str, gpu: int | None = None, bus_id: str | None = None,
            hca: str | None = None, code: int | None = None, error: int | None = None) -> dict[str, Any]:
    """One failure as gpudirect.json records it: `code` a CUresult, `errno` a C errno."""
    return {"kind": kind, "gpu": gpu, "busId": bus_id, "hca": hca, "call": call, "code": code,
            "errno": error, "message": message}


def errno_text(number: int) -> str:
    name = "EOPNOTSUPP" if number == errno.EOPNOTSUPP else errno.errorcode.get(number, "?")
    return f"errno {number} ({name}: {os.strerror(number)})"


class _Cuda:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        c_int, c_uint, void_p, size_t = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t
        ptr = ctypes.POINTER
        for name, argtypes in (
                ("cuInit", [c_uint]), ("cuDeviceGetCount", [ptr(c_int)]), ("cuDeviceGet", [ptr(c_int), c_int]),
                ("cuDeviceGetPCIBusId", [ctypes.c_char_p, c_int, c_int]),
                ("cuDeviceGetAttribute", [ptr(c_int), c_int, c_int]),
                ("cuDevicePrimaryCtxRetain", [ptr(void_p), c_int]), ("cuDevicePrimaryCtxRelease_v2", [c_int]),
                ("cuCtxSetCurrent", [void_p]), ("cuMemAlloc_v2", [ptr(ctypes.c_uint64), size_t]),
                ("cuMemFree_v2", [ctypes.c_uint64]), ("cuGetErrorName", [c_int, ptr(ctypes.c_char_p)])):
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, c_int

    def export(self) -> Any:
        """cuMemGetHandleForAddressRange, or None where the driver lacks it (before CUDA 11.7)."""
        try:
            function = self.lib.cuMemGetHandleForAddressRange
        except AttributeError:
            return None
        function.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong]
        function.restype = ctypes.c_int
        return function

    def name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) != 0 or not text.value:
            return f"CUDA error {code}"
        return f"CUDA error {code} ({text.value.decode()})"


class _Verbs:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        void_p = ctypes.c_void_p
        for name, argtypes, restype in (
                ("ibv_get_device_list", [ctypes.POINTER(ctypes.c_int)], ctypes.POINTER(void_p)),
                ("ibv_free_device_list", [ctypes.POINTER(void_p)], None),
                ("ibv_get_device_name", [void_p], ctypes.c_char_p),
                ("ibv_open_device", [void_p], void_p), ("ibv_close_device", [void_p], ctypes.c_int),
                ("ibv_alloc_pd", [void_p], void_p), ("ibv_dealloc_pd", [void_p], ctypes.c_int),
                ("ibv_dereg_mr", [void_p], ctypes.c_int)):
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype

    def reg_dmabuf(self) -> Any:
        """ibv_reg_dmabuf_mr, or None where libibverbs lacks it (rdma-core before v34)."""
        try:
            function = self.lib.ibv_reg_dmabuf_mr
        except AttributeError:
            return None
        function.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int,
                             ctypes.c_int]
        function.restype = ctypes.c_void_p
        return function


def link_layer(sysfs: Path, device: str) -> str | None:
    try:
        return (sysfs / device / "ports" / "1" / "link_layer").read_text().strip()
    except OSError:
        return None  # not known: probed (a device libibverbs lists is not left out on a guess)


def _hcas(failures: list[dict[str, Any]], sysfs: Path) -> tuple[_Verbs | None, list[tuple[str, Any, Any]],
                                                                  dict[str, str]]:
    """Open every InfiniBand HCA and a protection domain on it: (verbs, [(name, context, pd)],
    {skipped device: its link layer})."""
    try:
        lib = ctypes.CDLL(LIBIBVERBS, use_errno=True)
    except OSError as error:
        failures.append(failure(KIND_NO_HCA, f"dlopen({LIBIBVERBS})", f"libibverbs cannot be loaded ({error}): "
                                "the RDMA user space (Debian libibverbs1, rdma-core) is missing"))
        return None, [], {}
    verbs = _Verbs(lib)
    count = ctypes.c_int(0)
    ctypes.set_errno(0)
    devices = verbs.lib.ibv_get_device_list(ctypes.byref(count))
    if not devices:
        number = ctypes.get_errno()
        failures.append(failure(KIND_NO_HCA, "ibv_get_device_list", "libibverbs finds no RDMA support in the "
                                f"kernel: {errno_text(number)} (ib_uverbs not loaded?)", error=number))
        return verbs, [], {}
    opened, skipped = [], {}
    try:
        for i in range(count.value):
            device = devices[i]
            name = (verbs.lib.ibv_get_device_name(device) or b"?").decode(errors="replace")
            layer = link_layer(sysfs, name)
            if layer is not None and layer.lower() != "infiniband":
                skipped[name] = layer
                continue
            ctypes.set_errno(0)
            context = verbs.lib.ibv_open_device(device)
            if not context:
                number = ctypes.get_errno()
                failures.append(failure(KIND_UNAVAILABLE, "ibv_open_device", errno_text(number), hca=name,
                                        error=number))
                continue
            ctypes.set_errno(0)
            pd = verbs.lib.ibv_alloc_pd(context)
            if not pd:
                number = ctypes.get_errno()
                failures.append(failure(KIND_UNAVAILABLE, "ibv_alloc_pd", errno_text(number), hca=name, error=number))
                verbs.lib.ibv_close_device(context)
                continue
            opened.append((name, context, pd))
    finally:
        verbs.lib.ibv_free_device_list(devices)
    if not opened and not any(f["hca"] for f in failures):
        listed = (f"{count.value} RDMA device(s), none InfiniBand: "
                  + ", ".join(f"{n} (link layer {layer})" for n, layer in sorted(skipped.items()))
                  if count.value else "no RDMA device")
        failures.append(failure(KIND_NO_HCA, "ibv_get_device_list", f"libibverbs lists {listed} (ib_uverbs not "
                                "loaded, or the InfiniBand virtual functions not attached)"))
    return verbs, opened, skipped


def _gpu(cuda: _Cuda, export: Any, ordinal: int, failures: list[dict[str, Any]],
         page: int) -> tuple[str, ctypes.c_int, int, int, int] | None:
    """GPU `ordinal`'s dma-buf: (bus id, device, device pointer, fd, its page-aligned address),
    or None with its failure recorded. The caller closes the fd and frees the rest (_free_gpu)."""
    lib = cuda.lib
    device = ctypes.c_int()
    result = lib.cuDeviceGet(ctypes.byref(device), ordinal)
    if result != 0:
        failures.append(failure(KIND_UNAVAILABLE, "cuDeviceGet", cuda.name(result), gpu=ordinal, code=result))
        return None
    text = ctypes.create_string_buffer(32)
    bus_id = text.value.decode() if lib.cuDeviceGetPCIBusId(text, len(text), device) == 0 else None
    for attribute, name, lacking in (
            # NCCL asks this first, and without it uses no GPUDirect path at all (the docstring's sources)
            (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED",
             "0: CUDA says the GPU does not support GPUDirect RDMA, so NCCL (ncclGpuGdrSupport) gives it no "
             "GPUDirect path to any HCA, DMA-BUF or not"),
            (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED",
             "0: the GPU cannot export dma-bufs (the proprietary kernel module, not the open one, or a kernel "
             "without DMA-BUF)")):
        supported = ctypes.c_int(0)
        result = lib.cuDeviceGetAttribute(ctypes.byref(supported), attribute, device)
        call = f"cuDeviceGetAttribute({name})"
        if result != 0:
            failures.append(failure(KIND_UNAVAILABLE, call, cuda.name(result), ordinal, bus_id, code=result))
            return None
        if not supported.value:
            failures.append(failure(KIND_UNAVAILABLE, call, lacking, ordinal, bus_id))
            return None
    if export is None:
        failures.append(failure(KIND_UNAVAILABLE, "cuMemGetHandleForAddressRange", f"{LIBCUDA} lacks it (a "
                                "driver older than CUDA 11.7's, R515)", ordinal, bus_id))
        return None
    context = ctypes.c_void_p()
    result = lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    if result == active.CUDA_ERROR_SYSTEM_NOT_READY:
        raise active.SystemNotReady(f"cuDevicePrimaryCtxRetain(GPU {ordinal}): {cuda.name(result)}", result)
    if result != 0:
        failures.append(failure(KIND_UNAVAILABLE, "cuDevicePrimaryCtxRetain", cuda.name(result), ordinal, bus_id,
                                code=result))
        return None
    steps: list[tuple[str, int]] = []
    pointer = ctypes.c_uint64(0)
    try:
        result = lib.cuCtxSetCurrent(context)
        steps.append(("cuCtxSetCurrent", result))
        if result == 0:
            # one page more than the buffer, so a page-aligned range of BUFFER_BYTES fits in it
            result = lib.cuMemAlloc_v2(ctypes.byref(pointer), BUFFER_BYTES + page)
            steps.append((f"cuMemAlloc({BUFFER_BYTES + page})", result))
        if result == 0:
            aligned = (pointer.value + page - 1) & ~(page - 1)
            fd = ctypes.c_int(-1)
            result = export(ctypes.byref(fd), aligned, BUFFER_BYTES, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
            steps.append(("cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)", result))
            if result == 0:
                return bus_id or "", device, pointer.value, fd.value, aligned
    except BaseException:
        _free_gpu(cuda, device, pointer.value)
        raise
    call, result = steps[-1]
    failures.append(failure(KIND_UNAVAILABLE, call, cuda.name(result), ordinal, bus_id, code=result))
    _free_gpu(cuda, device, pointer.value)
    return None


def _free_gpu(cuda: _Cuda, device: Any, pointer: int) -> None:
    if pointer:
        cuda.lib.cuMemFree_v2(pointer)
    cuda.lib.cuDevicePrimaryCtxRelease_v2(device)


def probe(sysfs: Path = SYS_INFINIBAND, page: int | None = None) -> dict[str, Any]:
    """gpudirect.json, measured in this process (the child's side of `run`). Raises
    active.SystemNotReady for cudaErrorSystemNotReady (802) at CUDA's initialisation: the
    NVSwitch fabric is not trained yet, as the active check's caller handles it."""
    page = page or os.sysconf("SC_PAGESIZE")
    failures: list[dict[str, Any]] = []
    verbs, hcas, skipped = _hcas(failures, sysfs)
    gpus: list[dict[str, Any]] = []
    registered = 0
    try:
        # CUDA's ordinals in PCI bus order, as nvidia-smi numbers the GPUs (before cuInit)
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        try:
            cuda = _Cuda(ctypes.CDLL(LIBCUDA))
        except (OSError, AttributeError) as error:
            failures.append(failure(KIND_UNAVAILABLE, f"dlopen({LIBCUDA})", f"the CUDA driver library cannot be "
                                    f"used ({error})"))
            cuda = None
        count = ctypes.c_int(0)
        if cuda is not None:
            call, result = "cuInit", cuda.lib.cuInit(0)
            if result == active.CUDA_ERROR_SYSTEM_NOT_READY:
                raise active.SystemNotReady(f"cuInit: {cuda.name(result)}", result)
            if result == 0:
                call, result = "cuDeviceGetCount", cuda.lib.cuDeviceGetCount(ctypes.byref(count))
            if result != 0:
                count.value = 0
                failures.append(failure(KIND_UNAVAILABLE, call, cuda.name(result), code=result))
            elif count.value < 1:
                failures.append(failure(KIND_UNAVAILABLE, "cuDeviceGetCount", "CUDA finds no GPU"))
        reg = verbs.reg_dmabuf() if verbs is not None else None
        if verbs is not None and reg is None:
            failures.append(failure(KIND_UNAVAILABLE, "ibv_reg_dmabuf_mr", f"{LIBIBVERBS} lacks it (IBVERBS_1.12: "
                                    "rdma-core older than v34)"))
        export = cuda.export() if cuda is not None else None
        for ordinal in range(count.value):
            got = _gpu(cuda, export, ordinal, failures, page) if cuda is not None else None
            if got is None:
                gpus.append({"index": ordinal, "dmabuf": False})
                continue
            bus_id, device, pointer, fd, aligned = got
            gpus.append({"index": ordinal, "busId": bus_id, "dmabuf": True})
            try:
                for name, _context, pd in hcas if reg is not None else ():
                    ctypes.set_errno(0)
                    mr = reg(pd, 0, BUFFER_BYTES, aligned, fd, IBV_ACCESS)
                    if not mr:
                        number = ctypes.get_errno()
                        hint = (": the kernel or the HCA's driver registers no dma-buf (NCCL's own test, "
                                "ncclIbDmaBufSupport, would turn GPUDirect RDMA off)"
                                if number in (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT) else "")
                        failures.append(failure(KIND_UNAVAILABLE, "ibv_reg_dmabuf_mr", errno_text(number) + hint,
                                                ordinal, bus_id, name, error=number))
                        continue
                    result = verbs.lib.ibv_dereg_mr(mr) if verbs is not None else 0
                    if result != 0:
                        failures.append(failure(KIND_UNAVAILABLE, "ibv_dereg_mr", errno_text(result), ordinal, bus_id,
                                                name, error=result))
                        continue
                    registered += 1
            finally:
                os.close(fd)
                _free_gpu(cuda, device, pointer)
    finally:
        for _name, context, pd in hcas:
            verbs.lib.ibv_dealloc_pd(pd)
            verbs.lib.ibv_close_device(context)
    return {"tool": TOOL, "bufferBytes": BUFFER_BYTES, "gpus": gpus, "hcas": [name for name, _, _ in hcas],
            "skipped": skipped, "registered": registered, "failures": failures}


def child_command(sysfs: Path = SYS_INFINIBAND) -> list[str]:
    """The child's command line: this interpreter with the flags that shape its imports, this
    module as `-m` (as kilonode.gpu.active's child)."""
    flags = [flag for flag, on in (("-S", sys.flags.no_site), ("-s", sys.flags.no_user_site)) if on]
    return [sys.executable, *flags, "-m", f"{__package__}.gpudirect", "--sysfs", str(sysfs)]


def run(timeout_s: float | None = None) -> dict[str, Any]:
    """gpudirect.json, probed in a child process killed after `timeout_s` (default:
    thresholds.toml [agent] gpudirect_timeout_s). Raises active.SystemNotReady for 802 at
    CUDA's initialisation (the caller waits for the fabric as for the active check). A child
    that did not answer (ran out of time, died, crashed) is a KIND_UNVERIFIED failure: a node
    that must have GPUDirect RDMA is not vouched for without the probe's answer."""
    if timeout_s is None:
        timeout_s = float(thresholds()["agent"]["gpudirect_timeout_s"])
    what = "the GPUDirect RDMA probe"
    try:
        pid, returncode, out, err = active.run_child(child_command(SYS_INFINIBAND), timeout_s, what,
                                                     "gpudirect_timeout_s")
        return active._answer(pid, returncode, out, err, key="probe", what=what)
    except active.SystemNotReady:
        raise
    except active.Unusable as error:  # CudaFailure (timeout, a signal) among them
        return {"tool": TOOL, "gpus": [], "hcas": [], "skipped": {}, "registered": 0,
                "failures": [failure(KIND_UNVERIFIED, "the probe's process", str(error))]}


def main(argv: list[str] | None = None) -> int:
    """The child: probe, answer on stdout (one JSON object), exit 0."""
    parser = argparse.ArgumentParser(prog="python3 -m kilonode.gpu.gpudirect", description=__doc__.splitlines()[0])
    parser.add_argument("--sysfs", type=Path, default=SYS_INFINIBAND)
    args = parser.parse_args(argv)
    answer_fd = active.answer_channel()
    answer: dict[str, Any]
    try:
        answer = {"probe": probe(args.sysfs)}
    except active.SystemNotReady as error:
        answer = {"error": active.ANSWER_NOT_READY, "message": str(error), "code": error.code}
    return active.send_answer(answer_fd, answer)


if __name__ == "__main__":
    raise SystemExit(main())
