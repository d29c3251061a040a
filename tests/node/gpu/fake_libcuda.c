/* A fake libcuda.so.1 for kilonode.gpu.gpudirect's tests: the CUDA driver calls the probe makes,
 * with the real signatures (cuda.h), answering per environment variables; every call it gets
 * is appended to $FAKE_LOG, and what was left allocated, retained or open at exit too.
 *   FAKE_CUDA_GPUS          how many GPUs (default 2)
 *   FAKE_CUDA_INIT          cuInit's CUresult (default 0); FAKE_CUDA_HANG=1: cuInit never returns
 *   FAKE_CUDA_NO_GDR        ordinals whose CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED (116) is 0
 *   FAKE_CUDA_NO_DMABUF     ordinals whose CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (124) is 0 ("1,3")
 *   FAKE_CUDA_EXPORT_FAIL   ordinal:CUresult of cuMemGetHandleForAddressRange ("0:801")
 * A dma-buf is a memfd named fake-dmabuf:<ordinal>:<address>:<size>, so the fake libibverbs can
 * check what it is given. cuMemAlloc answers 0x100 past a page boundary, so an unaligned range
 * is refused as the driver refuses it. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_GPUS 16
#define BASE 0x7f0000000000ULL
#define SPAN 0x10000000ULL
#define PAGE 4096ULL

static int current = -1;
static int refs[MAX_GPUS];
static size_t allocated[MAX_GPUS];
static int fds[256], nfds;

static void say(const char *format, ...) {
    const char *path = getenv("FAKE_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (!log) return;
    va_list args;
    va_start(args, format);
    fprintf(log, "%d cuda ", (int)getpid());
    vfprintf(log, format, args);
    fputc('\n', log);
    va_end(args);
    fclose(log);
}

static int env_int(const char *name, int otherwise) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : otherwise;
}

static int listed(const char *name, int ordinal) {
    const char *value = getenv(name);
    for (const char *at = value; at && *at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL)
        if (atoi(at) == ordinal) return 1;
    return 0;
}

static int code_for(const char *name, int ordinal) {
    const char *value = getenv(name);
    for (const char *at = value; at && *at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL)
        if (atoi(at) == ordinal && strchr(at, ':')) return atoi(strchr(at, ':') + 1);
    return 0;
}

static int gpus(void) { return env_int("FAKE_CUDA_GPUS", 2); }

__attribute__((constructor)) static void loaded(void) { say("loaded"); }

__attribute__((destructor)) static void unloaded(void) {
    for (int i = 0; i < MAX_GPUS; i++) {
        if (allocated[i]) say("LEAK allocation on GPU %d", i);
        if (refs[i]) say("LEAK primary context of GPU %d (%d)", i, refs[i]);
    }
    for (int i = 0; i < nfds; i++)
        if (fcntl(fds[i], F_GETFD) != -1) say("LEAK dma-buf fd %d", fds[i]);
}

int cuInit(unsigned int flags) {
    say("cuInit(%u)", flags);
    if (env_int("FAKE_CUDA_HANG", 0)) sleep(3600);
    return env_int("FAKE_CUDA_INIT", 0);
}

int cuDeviceGetCount(int *count) { *count = gpus(); return 0; }

int cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal >= gpus()) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = 100 + ordinal; /* a handle, not the ordinal */
    return 0;
}

int cuDeviceGetPCIBusId(char *bus_id, int length, int device) {
    snprintf(bus_id, length, "0000:%02X:00.0", 0x10 + device - 100);
    return 0;
}

int cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (device < 100 || device >= 100 + gpus()) return 101;
    /* the two the probe asks; any other attribute is 0 */
    *value = attribute == 116 ? !listed("FAKE_CUDA_NO_GDR", device - 100)
           : attribute == 124 ? !listed("FAKE_CUDA_NO_DMABUF", device - 100) : 0;
    say("cuDeviceGetAttribute(%d, GPU %d) = %d", attribute, device - 100, *value);
    return 0;
}

int cuDevicePrimaryCtxRetain(void **context, int device) {
    refs[device - 100]++;
    *context = (void *)(uintptr_t)(0x1000 + device);
    return 0;
}

int cuDevicePrimaryCtxRelease_v2(int device) { refs[device - 100]--; return 0; }

int cuCtxSetCurrent(void *context) { current = (int)((uintptr_t)context - 0x1000 - 100); return 0; }

int cuMemAlloc_v2(unsigned long long *pointer, size_t size) {
    if (current < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    *pointer = BASE + current * SPAN + 0x100;
    allocated[current] = size;
    say("cuMemAlloc(%zu) on GPU %d = 0x%llx", size, current, *pointer);
    return 0;
}

int cuMemFree_v2(unsigned long long pointer) {
    int gpu = (int)((pointer - BASE) / SPAN);
    if (!allocated[gpu]) return 1;
    allocated[gpu] = 0;
    return 0;
}

int cuMemGetHandleForAddressRange(void *handle, unsigned long long pointer, size_t size, int type,
                                  unsigned long long flags) {
    int gpu = (int)((pointer - BASE) / SPAN), code = code_for("FAKE_CUDA_EXPORT_FAIL", current);
    say("cuMemGetHandleForAddressRange(0x%llx, %zu, type %d, flags %llu) on GPU %d", pointer, size, type, flags,
        current);
    if (code) return code;
    unsigned long long start = BASE + gpu * SPAN + 0x100;
    if (type != 1 || flags != 0 || gpu != current || pointer % PAGE || size % PAGE || pointer < start ||
        pointer + size > start + allocated[gpu])
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    char name[96];
    snprintf(name, sizeof name, "fake-dmabuf:%d:%llu:%zu", gpu, pointer, size);
    int fd = memfd_create(name, 0);
    fds[nfds++] = fd;
    *(int *)handle = fd;
    return 0;
}

int cuGetErrorName(int error, const char **text) {
    static const struct { int code; const char *name; } names[] = {
        {0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
        {101, "CUDA_ERROR_INVALID_DEVICE"}, {201, "CUDA_ERROR_INVALID_CONTEXT"},
        {801, "CUDA_ERROR_NOT_SUPPORTED"}, {802, "CUDA_ERROR_SYSTEM_NOT_READY"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == error) { *text = names[i].name; return 0; }
    *text = NULL;
    return 1;
}
