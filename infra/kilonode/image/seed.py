"""NoCloud seed: the pool's user-data (what Azure receives as custom data) on a CIDATA disk.

meta-data carries the instance ID and the verifier's throwaway SSH public key, the way
Azure's platform supplies the admin user's key: the user-data is the pool's, untouched.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import paramiko


def make_keypair(directory: Path) -> tuple[Path, str]:
    """A throwaway key for one verify run: (private key file, public key line)."""
    key = paramiko.ECDSAKey.generate(bits=256)
    private = directory / "id_ecdsa"
    key.write_private_key_file(str(private))
    private.chmod(0o600)
    return private, f"{key.get_name()} {key.get_base64()} kilonode-verify"


def meta_data(public_key: str, hostname: str) -> str:
    # A fresh instance-id makes cloud-init treat the VM as a new instance (per-instance
    # modules run), exactly as on a newly created Azure VM.
    return (
        f"instance-id: kilonode-verify-{uuid.uuid4().hex[:12]}\n"
        f"local-hostname: {hostname}\n"
        f"public-keys:\n  - {public_key}\n"
    )


def make_seed(out: Path, user_data: str, meta: str) -> Path:
    """A 2 MiB FAT image labelled CIDATA holding user-data and meta-data (no mounts)."""
    staging = out.parent / (out.name + ".d")
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "user-data").write_text(user_data)
    (staging / "meta-data").write_text(meta)
    out.unlink(missing_ok=True)
    subprocess.run(["mkfs.vfat", "-n", "CIDATA", "-C", str(out), "2048"], check=True, capture_output=True)
    subprocess.run(
        ["mcopy", "-i", str(out), str(staging / "user-data"), str(staging / "meta-data"), "::/"],
        check=True,
        capture_output=True,
    )
    return out
