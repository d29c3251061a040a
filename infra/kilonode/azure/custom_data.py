"""Azure custom data: the rendered user-data plus the TLS files, as cloud-init multipart MIME.

Part 1 is the role's rendered user-data, unchanged (what `kilonode render` shows and the
golden tests pin). Part 2 is a `#cloud-config` whose `write_files` carries the certificates
and keys Pulumi created; its `merge_how` appends lists, so the rendered `write_files` and
`runcmd` survive the merge instead of being replaced. Keeping the key material out of the
renderer keeps rendering pure and the golden files free of secrets.

The boundary and every header are fixed, so the same inputs give byte-identical custom
data (a changed VM custom data replaces the VM; it must only change when a file changes).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from kilonode.yamlio import block_yaml

BOUNDARY = "kilonode-custom-data-boundary"

# cloud-init's documented way to say "append my lists to earlier parts' lists" (merging
# user-data sections); the default would replace the rendered write_files.
MERGE_HOW = [
    {"name": "list", "settings": ["append"]},
    {"name": "dict", "settings": ["no_replace", "recurse_list"]},
]

# Checked when composed, on the base64 text. Azure's own limit is on the decoded bytes: "The
# maximum length of the binary array is 65535 bytes" (osProfile.customData, Compute REST API),
# so at most 87,380 base64 characters (its InvalidParameter error says so: "Custom data in
# OSProfile must be in Base64 encoding and with a maximum length of 87380 characters",
# Azure/aks-engine#1663). Holding the base64 text to 65,535 is a quarter stricter than Azure.
# Preflight's custom-data-size measures every host against this (kilonode.preflight.checks).
AZURE_CUSTOM_DATA_MAX_BYTES = 65535

KEY_MODE = 0o600
CERT_MODE = 0o644
ROOT = "root:root"


@dataclass(frozen=True)
class DeliveredFile:
    """A file Pulumi creates (certificate, key) and cloud-init writes at first boot."""

    path: str  # absolute host path, from kilonode.plan.wellknown
    content: pulumi.Input[str]
    mode: int = CERT_MODE
    # A file owned by a service user (etcd, which the etcd image carries) is written by
    # cloud-init's deferred write_files, in the final stage just before runcmd starts the
    # unit (cloud_final_modules order), so it never exists with another owner.
    owner: str = ROOT


# (path, content, mode, owner): a DeliveredFile with its content resolved.
FileEntry = tuple[str, str, int, str]


def _content_type(text: str) -> str:
    first = text.split("\n", 1)[0].strip()
    if first == "#cloud-config":
        return "text/cloud-config"
    if first.startswith("#!"):
        return "text/x-shellscript"
    raise ValueError(
        f"rendered user-data must start with '#cloud-config' or '#!' (starts with {first[:40]!r})"
    )


def files_part(files: Sequence[FileEntry]) -> str:
    """The `#cloud-config` part that writes the files, sorted by path."""
    entries: list[dict[str, object]] = []
    for path, content, mode, owner in sorted(files):
        entry: dict[str, object] = {"path": path, "content": content, "owner": owner,
                                    "permissions": f"{mode:04o}"}
        if owner != ROOT:
            entry["defer"] = True
        entries.append(entry)
    body = block_yaml({"merge_how": MERGE_HOW, "write_files": entries}, width=None)
    return "#cloud-config\n" + body


def compose_mime(user_data: str, files: Sequence[FileEntry]) -> str:
    """Multipart MIME: the rendered user-data unchanged, then the files part."""
    parts = [("user-data", user_data)]
    if files:
        parts.append(("kilonode-tls.cfg", files_part(files)))
    out = [
        f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"',
        "MIME-Version: 1.0",
        "",
    ]
    for filename, text in parts:
        if BOUNDARY in text:
            raise ValueError(f"{filename} contains the MIME boundary {BOUNDARY!r}")
        out += [
            f"--{BOUNDARY}",
            f'Content-Type: {_content_type(text)}; charset="utf-8"',
            "MIME-Version: 1.0",
            "Content-Transfer-Encoding: 8bit",
            f'Content-Disposition: attachment; filename="{filename}"',
            "",
            text.rstrip("\n"),
        ]
    out += [f"--{BOUNDARY}--", ""]
    return "\n".join(out)


def encode(mime: str, who: str) -> str:
    encoded = base64.b64encode(mime.encode()).decode()
    if len(encoded) > AZURE_CUSTOM_DATA_MAX_BYTES:
        raise ValueError(
            f"custom data for {who} is {len(encoded)} bytes base64-encoded, above Azure's "
            f"{AZURE_CUSTOM_DATA_MAX_BYTES}; shrink the rendered user-data"
        )
    return encoded


def decode(custom_data: str) -> str:
    """Inverse of `encode`, for tests and for reading a plan."""
    return base64.b64decode(custom_data).decode()


def custom_data(user_data: str, files: Sequence[DeliveredFile], who: str) -> pulumi.Output[str]:
    """Base64 custom data for one host role, as a secret Output (it carries private keys).

    Only string formatting happens inside the apply; no resource is created there.
    """
    contents = pulumi.Output.all(*[f.content for f in files])
    composed = contents.apply(lambda values: encode(compose_mime(user_data, [
        (f.path, value, f.mode, f.owner) for f, value in zip(files, values, strict=True)
    ]), who))
    return pulumi.Output.secret(composed)
