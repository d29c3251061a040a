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

Standard library only at import time (torch is imported by main()), so the pure parts can be
tested where PyTorch is absent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

FLOAT32_BYTES = 4
MIN_BYTES = 1 << 20
WARMUP = 5
ITERATIONS = 20


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


def verdict(peak_busbw: float, wrong: int, floor: float | None, ceiling: float | None) -> tuple[bool, str]:
    """(whether the run passes, the line that says why): no wrong element, and the peak at or
    above the floor where one is given."""
    against = (f"; this size's two-node network ceiling with GPUDirect RDMA is {ceiling:.0f} GB/s, the floor "
               f"{floor:.0f} GB/s" if ceiling and floor else "")
    if wrong:
        return False, f"# FAIL: {wrong} elements of the check all-reduce were wrong{against}"
    if floor is not None and peak_busbw < floor:
        return False, (f"# FAIL: peak busbw {peak_busbw:.2f} GB/s is below the floor{against}: read NCCL's NET/IB "
                       "lines above (GPU Direct RDMA Disabled, or NET/Socket) and docs/nccl-job.md")
    share = f" ({peak_busbw / ceiling:.0%} of the ceiling)" if ceiling else ""
    return True, f"# PASS: peak busbw {peak_busbw:.2f} GB/s{share}{against}"


def _env_float(name: str) -> float | None:
    value = os.environ.get(name, "")
    return float(value) if value else None


HEADER = f"{'size(B)':>12} {'count':>12}  type  redop {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"


def main() -> None:
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
        del data
    # every rank holds the same figures (the times and the wrong counts were all-reduced): each
    # reaches the same verdict and exits with it
    passed, line = verdict(peak[0], wrong_total, _env_float("BUSBW_FLOOR_GBPS"), _env_float("NETWORK_CEILING_GBPS"))
    if rank == 0:
        print(f"# peak busbw {peak[0]:.2f} GB/s at {peak[1]} bytes", flush=True)
        print(line, flush=True)
    dist.destroy_process_group()
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
