"""NVLink state through NVML (libnvidia-ml.so.1, Debian's libnvidia-ml1 in GPU images) by
ctypes, in the layout kilonode.gpu.readings reads from nvml.json (the fixtures' nvml.json was
written with NVIDIA's pynvml the same way: per GPU its UUID and, per link 0..17, 1 active,
0 inactive, or {"error": ...} where the GPU has no such link).

Signatures, from NVIDIA's nvml.h: nvmlInit_v2(void), nvmlShutdown(void),
nvmlDeviceGetCount_v2(unsigned int*), nvmlDeviceGetHandleByIndex_v2(unsigned int,
nvmlDevice_t*), nvmlDeviceGetUUID(nvmlDevice_t, char*, unsigned int),
nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned int link, nvmlEnableState_t*); all return
nvmlReturn_t: NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3. NVML_NVLINK_MAX_LINKS = 18;
nvmlEnableState_t NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1; UUID buffers of
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96. Unmeasured here (no GPU); the fixtures' recording
agrees on the layout (a PCIe H100: every link query NotSupported).
"""

from __future__ import annotations

import ctypes
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
MAX_LINKS = 18
UUID_BUFFER = 96
SUCCESS, NOT_SUPPORTED = 0, 3


def nvlink_states() -> dict[str, Any] | None:
    """{"gpus": [{"index", "uuid", "nvlink_state"}]}, or None when NVML cannot be used here
    (the caller then notes that NVLink was not checked)."""
    try:
        nvml = ctypes.CDLL(LIBRARY)
    except OSError:
        return None
    void_p, uint = ctypes.c_void_p, ctypes.c_uint
    nvml.nvmlDeviceGetCount_v2.argtypes = [ctypes.POINTER(uint)]
    nvml.nvmlDeviceGetHandleByIndex_v2.argtypes = [uint, ctypes.POINTER(void_p)]
    nvml.nvmlDeviceGetUUID.argtypes = [void_p, ctypes.c_char_p, uint]
    nvml.nvmlDeviceGetNvLinkState.argtypes = [void_p, uint, ctypes.POINTER(ctypes.c_int)]
    if nvml.nvmlInit_v2() != SUCCESS:
        return None
    try:
        count = uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != SUCCESS:
            return None
        gpus = []
        for index in range(count.value):
            handle = void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != SUCCESS:
                continue  # nvidia-smi's view (the GPU count check) reports a GPU NVML cannot open
            uuid = ctypes.create_string_buffer(UUID_BUFFER)
            nvml.nvmlDeviceGetUUID(handle, uuid, UUID_BUFFER)
            states: list[Any] = []
            for link in range(MAX_LINKS):
                active = ctypes.c_int()
                result = nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(active))
                states.append(int(active.value != 0) if result == SUCCESS else {"error": f"nvmlReturn {result}"})
            gpus.append({"index": index, "uuid": uuid.value.decode(errors="replace"), "nvlink_state": states})
        return {"tool": "kilonode.gpu.nvml (ctypes)", "gpus": gpus}
    finally:
        nvml.nvmlShutdown()
