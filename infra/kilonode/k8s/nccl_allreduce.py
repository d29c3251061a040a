"""All-reduce bandwidth over torch.distributed's NCCL backend, one process per GPU under torchrun.

Delivered to the pods of the job kilonode.k8s.nccl_job builds (a ConfigMap holds this file's
text; the job's image brings PyTorch and NCCL). It all-reduces float32 tensors from 1 MiB up to
ALLREDUCE_MAX_BYTES per GPU (powers of two), times each size on every rank, takes the slowest
rank's time as nccl-tests does, and rank 0 prints one row per size: the time, the algorithm
bandwidth and the bus bandwidth as NVIDIA/nccl-tests doc/PERFORMANCE.md defines them for
AllReduce (algbw = S/t; busbw = algbw * 2(n-1)/n, n the number of ranks, GB = 10^9 bytes), and
whether the result was right. The last lines name the peak bus bandwidth and judge the run:
with BUSBW_FLOOR_GBPS set (the job sets it from the size's InfiniBand links:
NETWORK_CEILING_GBPS), a peak below the floor, or any wrong element, fails the run (every rank
exits 1, so the Job fails) instead of ending like a good run: a gang staged through host memory
or over TCP is the failure this job is there to show.

With REQUIRE_GDRDMA=1 (the job sets it on a gang over InfiniBand) it also reads NCCL's own log:
each rank has NCCL write it to NCCL_DEBUG_FILE (its own file, unless the job names one), copies
the new lines to stdout after each size (from the first, NCCL has connected the ranks) and at
the end, a failure's included, and the run fails unless NCCL's channels go via NET and every
one of them says /GDRDMA. NCCL 2.18.3 writes each network channel it connects as `Channel
%02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s` (or `... via NET/%s/%d(%d)%s%s` through a
proxy rank, and `[receive]`), the first suffix "/GDRDMA" when the connection uses GPUDirect
RDMA and "" when it stages through host memory (NVIDIA/nccl v2.18.3-1 src/transport/net.cc:
186-190 and 227-228). That is the one place a run shows GPUDirect RDMA off, which happens
silently where the container's libibverbs lacks ibv_reg_dmabuf_mr (rdma-core older than 34) or
the node lost DMA-BUF; the bandwidth floor alone may still pass on a gang staged through host
memory.

With REQUIRE_IB_HCAS=<n> (the job sets it on a gang over InfiniBand to the size's link count) the
run also fails unless every rank's NCCL opened n InfiniBand HCAs. NCCL 2.18.3 names the ports it
opened in one INFO line, `NET/IB : Using%s %s; OOB %s:%s`, each port written ` [%d]%s:%d/%s` (its
index, device, port, and IB or RoCE) and then `[RO]` where relaxed ordering is on (NVIDIA/nccl
v2.18.3-1 src/transport/net_ib.cc:258-265). A pod handed only some of the node's HCAs (the RDMA
device plugin gives a pod the devices of its last scan, and a virtual function may arrive after
it) runs every channel over fewer links, which the floor alone may not catch.

Standard library only at import time (torch is imported by main()), so the pure parts can be
tested where PyTorch is absent.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator

FLOAT32_BYTES = 4
MIN_BYTES = 1 << 20
WARMUP = 5
ITERATIONS = 20
# NCCL's network channel lines (v2.18.3-1 src/transport/net.cc:186-190, 227-228), its GPUDirect suffix
CHANNEL = re.compile(r"Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] \[(?:send|receive)\] "
                     r"via NET/(?P<net>[^/\s]+)/\d+(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
# NCCL's list of the InfiniBand ports it opened (v2.18.3-1 src/transport/net_ib.cc:258-265), and each port in it
IB_USING = re.compile(r"NET/IB : Using(?P<ports>(?: \[\d+\][^\s:]+:\d+/(?:IB|RoCE))*)")
IB_PORT = re.compile(r"\[\d+\](?P<device>[^\s:]+):(?P<port>\d+)/(?P<link>IB|RoCE)")
NCCL_LOG_ENV = "NCCL_DEBUG_FILE"
NCCL_LOG_DIR = "/tmp"  # the container's own /tmp: a rank's log is kilonode-nccl-rank<RANK>.log there


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' AllReduce bus bandwidth: algbw * 2(n-1)/n (doc/PERFORMANCE.md, "AllReduce")."""
    return algbw * 2 * (ranks - 1) / ranks


def sizes(max_bytes: int, min_bytes: int = MIN_BYTES) -> Iterator[int]:
    """Message sizes in bytes: powers of two from min_bytes up to max_bytes."""
    size = min_bytes
    while size <= max_bytes:
        yield size
        size *= 2


def row(size: int, seconds: float, ranks: int, wrong: int) -> str:
    """One line of the table, in nccl-tests' units: bytes, elements, microseconds, GB/s."""
    algbw = size / seconds / 1e9
    return (f"{size:>12d} {size // FLOAT32_BYTES:>12d}  float    sum {seconds * 1e6:>10.1f} "
            f"{algbw:>7.2f} {bus_bandwidth(algbw, ranks):>7.2f} {wrong:>6d}")


def net_channels(lines: Iterable[str]) -> tuple[int, int]:
    """(NCCL's channels via NET in these log lines, those of them via GPUDirect RDMA)."""
    found = [m for m in (CHANNEL.search(line) for line in lines) if m]
    return len(found), sum(1 for m in found if m.group("gdr"))


def ib_hcas(lines: Iterable[str]) -> int:
    """How many InfiniBand ports (one per HCA on these sizes) NCCL's last `NET/IB : Using` line in
    these log lines names; 0 where there is none."""
    found = [m for m in (IB_USING.search(line) for line in lines) if m]
    return sum(1 for p in IB_PORT.finditer(found[-1].group("ports")) if p.group("link") == "IB") if found else 0


def verdict(peak_busbw: float, wrong: int, floor: float | None, ceiling: float | None,
            channels: tuple[int, int] | None = None, hcas: tuple[int, int] | None = None) -> tuple[bool, str]:
    """(whether the run passes, the line that says why): no wrong element, where `hcas` (the
    fewest InfiniBand HCAs any rank's NCCL opened, the size's link count) is given at least that
    many, where `channels` (NCCL's channels via NET over all ranks, those via GPUDirect RDMA) is
    given every one of them via GPUDirect RDMA, and the peak at or above the floor where one is
    given."""
    against = (f"; this size's two-node network ceiling with GPUDirect RDMA is {ceiling:.0f} GB/s, the floor "
               f"{floor:.0f} GB/s" if ceiling and floor else "")
    if wrong:
        return False, f"# FAIL: {wrong} elements of the check all-reduce were wrong{against}"
    if hcas is not None and hcas[0] < hcas[1]:
        return False, (f"# FAIL: a rank's NCCL opened {hcas[0]} InfiniBand HCAs (its `NET/IB : Using` line), the size "
                       f"has {hcas[1]} links: the pod got only some of the node's HCAs (rdma/ib handed out an older "
                       "scan of the RDMA device plugin, or a virtual function is missing); read the NET/IB lines "
                       "above and docs/nccl-job.md")
    if channels is not None and not channels[0]:
        return False, ("# FAIL: NCCL's log names no channel via NET (NCCL_DEBUG=INFO lines `Channel ... via "
                       "NET/IB/<n>/GDRDMA`): the ranks did not talk over the network, or the log was not read")
    if channels is not None and channels[1] < channels[0]:
        return False, (f"# FAIL: {channels[0] - channels[1]} of {channels[0]} NCCL channels via NET lack /GDRDMA: "
                       "NCCL stages them through host memory (GPUDirect RDMA off: the image's libibverbs without "
                       "ibv_reg_dmabuf_mr, rdma-core older than 34, or a node without DMA-BUF); read the channel "
                       "lines above and docs/nccl-job.md")
    if floor is not None and peak_busbw < floor:
        return False, (f"# FAIL: peak busbw {peak_busbw:.2f} GB/s is below the floor{against}: read NCCL's NET/IB "
                       "lines above (GPU Direct RDMA Disabled, or NET/Socket) and docs/nccl-job.md")
    share = f" ({peak_busbw / ceiling:.0%} of the ceiling)" if ceiling else ""
    return True, f"# PASS: peak busbw {peak_busbw:.2f} GB/s{share}{against}"


def _env_float(name: str) -> float | None:
    value = os.environ.get(name, "")
    return float(value) if value else None


class NcclLog:
    """This rank's NCCL log (NCCL_DEBUG_FILE: NCCL writes it unbuffered, src/debug.cc), read as it
    grows: `echo` copies the lines not yet seen to stdout and keeps them for the verdict."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.lines: list[str] = []

    def echo(self) -> None:
        try:
            with open(self.path, errors="replace") as log:
                log.seek(self.offset)
                text = log.read()
                self.offset = log.tell()
        except OSError:
            return  # NCCL has not opened it yet (or could not: its lines went to stdout)
        new = text.splitlines()
        self.lines += new
        if new:
            print("\n".join(new), flush=True)


HEADER = f"{'size(B)':>12} {'count':>12}  type  redop {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"


def main() -> None:
    # each rank's NCCL log in a file of its own, set before NCCL starts (it reads it at its first call)
    own = f"{NCCL_LOG_DIR}/kilonode-nccl-rank{os.environ.get('RANK', '0')}.log"
    log = NcclLog(os.environ.setdefault(NCCL_LOG_ENV, own))
    try:
        _benchmark(log)
    finally:
        log.echo()  # what NCCL said last, a failure's reason among it


def _benchmark(log: NcclLog) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    max_bytes = int(os.environ.get("ALLREDUCE_MAX_BYTES", str(8 << 30)))
    if rank == 0:
        print(f"# all_reduce over {ranks} ranks (NCCL {torch.cuda.nccl.version()}), "
              f"float32, in place; GB/s = 10^9 bytes/s; busbw = algbw * 2({ranks}-1)/{ranks}", flush=True)
        print(HEADER, flush=True)
    peak = (0.0, 0)
    wrong_total = 0
    for size in sizes(max_bytes):
        data = torch.ones(size // FLOAT32_BYTES, dtype=torch.float32, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(data)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            dist.all_reduce(data)
        torch.cuda.synchronize()
        slowest = torch.tensor([(time.perf_counter() - start) / ITERATIONS], device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        # correctness: every rank contributes rank+1, so every element must be n(n+1)/2
        data.fill_(rank + 1)
        dist.all_reduce(data)
        wrong = torch.tensor([int((data != ranks * (ranks + 1) / 2).sum().item())], device="cuda")
        dist.all_reduce(wrong)
        seconds = float(slowest.item())
        busbw = bus_bandwidth(size / seconds / 1e9, ranks)
        peak = max(peak, (busbw, size))
        wrong_total += int(wrong.item())
        if rank == 0:
            print(row(size, seconds, ranks, int(wrong.item())), flush=True)
        log.echo()  # from the first size on: NCCL has connected the ranks and named each channel
        del data
    # every rank holds the same figures (the times and the wrong counts were all-reduced): each
    # reaches the same verdict and exits with it
    log.echo()
    hcas = None
    if os.environ.get("REQUIRE_IB_HCAS"):
        fewest = torch.tensor([ib_hcas(log.lines)], device="cuda")
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN)  # each rank opened its own
        hcas = (int(fewest.item()), int(os.environ["REQUIRE_IB_HCAS"]))
    channels = None
    if os.environ.get("REQUIRE_GDRDMA") == "1":
        counts = torch.tensor(list(net_channels(log.lines)), device="cuda")
        dist.all_reduce(counts)  # every rank's channels: each rank logs its own
        channels = (int(counts[0].item()), int(counts[1].item()))
    passed, line = verdict(peak[0], wrong_total, _env_float("BUSBW_FLOOR_GBPS"), _env_float("NETWORK_CEILING_GBPS"),
                           channels, hcas)
    if rank == 0:
        print(f"# peak busbw {peak[0]:.2f} GB/s at {peak[1]} bytes", flush=True)
        print(line, flush=True)
    dist.destroy_process_group()
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
