"""Helpers the verification suite's checks share (the suite ships as data: see infra/paths.py)."""

from __future__ import annotations

import testinfra


def same_disk(host: testinfra.host.Host, source: str, device: str) -> bool:
    """Is mount source `source` the plan's `device`, or a partition of it?

    The plan may name a stable symlink (Azure: /dev/disk/cloud/azure_resource) while the
    kernel reports /dev/sdb1: compare resolved paths.
    """
    resolved = run_ok(host, f"readlink -f {source} {device}").split()
    if len(resolved) != 2:
        return False
    real_source, real_device = resolved
    return real_source == real_device or (
        real_source.startswith(real_device) and real_source[len(real_device):].lstrip("p").isdigit()
    )


def run_ok(host: testinfra.host.Host, command: str) -> str:
    """Run on the node; fail the check with the command's output if it fails."""
    result = host.run(command)
    assert result.rc == 0, f"`{command}` exited {result.rc}: {result.stderr.strip() or result.stdout.strip()}"
    return str(result.stdout)
