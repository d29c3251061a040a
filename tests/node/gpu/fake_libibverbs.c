/* A fake libibverbs.so.1 for kilonode.gpu.gpudirect's tests: the verbs the probe calls, with
 * rdma-core's signatures (libibverbs/verbs.h), answering per environment variables; every call
 * is appended to $FAKE_LOG, and what was left open or registered at exit too.
 *   FAKE_IB_DEVICES      the devices, comma-separated (default "mlx5_ib0,mlx5_ib1"; "" none)
 *   FAKE_IB_LIST_ERRNO   ibv_get_device_list fails with this errno (no kernel support: ENOSYS)
 *   FAKE_IB_OPEN_FAIL    device:errno of ibv_open_device
 *   FAKE_IB_REG_FAIL     device:errno of ibv_reg_dmabuf_mr ("*" every device)
 * Built with -DOLD_RDMA_CORE it has no ibv_reg_dmabuf_mr, as rdma-core before v34.
 * ibv_reg_dmabuf_mr checks that the fd is a dma-buf of the fake libcuda (a memfd it named), that
 * the range is inside it, the iova its address and the access NCCL's. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

struct ibv_device { char name[64]; };
struct ibv_context { struct ibv_device *device; };
struct ibv_pd { struct ibv_context *context; };
struct ibv_mr { struct ibv_pd *pd; };

static struct ibv_device devices[16];
static int contexts, pds, mrs;

static void say(const char *format, ...) {
    const char *path = getenv("FAKE_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (!log) return;
    va_list args;
    va_start(args, format);
    fprintf(log, "%d ibverbs ", (int)getpid());
    vfprintf(log, format, args);
    fputc('\n', log);
    va_end(args);
    fclose(log);
}

static int errno_for(const char *variable, const char *device) {
    const char *value = getenv(variable);
    size_t length = strlen(device);
    for (const char *at = value; at && *at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL) {
        if ((at[0] == '*' && at[1] == ':') ) return atoi(at + 2);
        if (!strncmp(at, device, length) && at[length] == ':') return atoi(at + length + 1);
    }
    return 0;
}

__attribute__((constructor)) static void loaded(void) { say("loaded"); }

__attribute__((destructor)) static void unloaded(void) {
    if (contexts) say("LEAK %d device(s) open", contexts);
    if (pds) say("LEAK %d protection domain(s)", pds);
    if (mrs) say("LEAK %d memory region(s)", mrs);
}

struct ibv_device **ibv_get_device_list(int *num_devices) {
    const char *list = getenv("FAKE_IB_DEVICES");
    if (getenv("FAKE_IB_LIST_ERRNO")) { errno = atoi(getenv("FAKE_IB_LIST_ERRNO")); return NULL; }
    if (!list) list = "mlx5_ib0,mlx5_ib1";
    struct ibv_device **found = calloc(17, sizeof *found);
    int n = 0;
    for (const char *at = list; *at && n < 16; n++) {
        size_t length = strcspn(at, ",");
        snprintf(devices[n].name, sizeof devices[n].name, "%.*s", (int)length, at);
        found[n] = &devices[n];
        at += length + (at[length] == ',');
    }
    if (num_devices) *num_devices = n;
    say("ibv_get_device_list = %d", n);
    return found;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); say("ibv_free_device_list"); }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

struct ibv_context *ibv_open_device(struct ibv_device *device) {
    int error = errno_for("FAKE_IB_OPEN_FAIL", device->name);
    if (error) { errno = error; return NULL; }
    struct ibv_context *context = calloc(1, sizeof *context);
    context->device = device;
    contexts++;
    return context;
}

int ibv_close_device(struct ibv_context *context) { free(context); contexts--; return 0; }

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
    struct ibv_pd *pd = calloc(1, sizeof *pd);
    pd->context = context;
    pds++;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) { free(pd); pds--; return 0; }

#ifndef OLD_RDMA_CORE
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                 int access) {
    const char *name = pd->context->device->name;
    char link[64], target[256] = "";
    int gpu = -1, error = errno_for("FAKE_IB_REG_FAIL", name);
    unsigned long long address = 0;
    size_t size = 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if (readlink(link, target, sizeof target - 1) < 0 || fcntl(fd, F_GETFD) == -1) error = error ? error : EBADF;
    else if (sscanf(target, "/memfd:fake-dmabuf:%d:%llu:%zu", &gpu, &address, &size) != 3) error = error ? error : EINVAL;
    else if (offset + length > size || iova != address + offset || access != 7) error = error ? error : EINVAL;
    say("ibv_reg_dmabuf_mr(%s, offset %llu, length %zu, iova 0x%llx, GPU %d, access %d) = %d", name,
        (unsigned long long)offset, length, (unsigned long long)iova, gpu, access, error);
    if (error) { errno = error; return NULL; }
    struct ibv_mr *mr = calloc(1, sizeof *mr);
    mr->pd = pd;
    mrs++;
    return mr;
}
#endif

int ibv_dereg_mr(struct ibv_mr *mr) { free(mr); mrs--; return 0; }
