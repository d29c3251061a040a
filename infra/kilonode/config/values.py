"""The kinds of value a stack file may hold, each defined once as a pydantic annotated type.

Every string that reaches a host (a systemd unit or drop-in, /etc/sysctl.d, a shell script,
cloud-init, a kubelet flag) is one of these, so that no value can add a line, a word or a
shell token to what is rendered: the renderers may then write values as they are. A value a
type refuses is reported with its field path, shown at most `SHOWN` characters long.

Numbers and booleans are strict: YAML's `true` is not 1, `4.0` is not 4 and `"4"` is not 4
(pydantic's lax mode would take all three). Text is strict too: a YAML number is not text.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, GetCoreSchemaHandler, Strict
from pydantic_core import CoreSchema, core_schema

from kilonode.catalog.bounds import number_range, reader
from kilonode.catalog.ssh_keys import ssh_key_rules
from kilonode.config.keys import ed25519_problem, parsed_problem, rsa_problem

# how much of a value an error message shows: a 50 MB value must not come back 50 MB long
SHOWN = 80


def shown(value: Any, limit: int = SHOWN) -> str:
    """`value` as an error message quotes it: repr (control characters escaped), at most
    `limit` characters."""
    text = ascii(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


@dataclass(frozen=True)
class Accepts:
    """What a typed value accepts, in words: docs/stack-reference.md's constraints column."""

    text: str


Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


# how a reader's type reads in a sentence (catalog/bounds.yaml types)
TYPE_WORDS = {"int32": "a 32-bit signed integer", "int64": "a 64-bit signed integer",
              "int": "a Go int (64 bits)", "uint64": "a 64-bit unsigned integer",
              "duration": "a Go duration (a 64-bit count of nanoseconds)"}


def out_of_range(key: str, value: int, what: str = "") -> str | None:
    """Why `value` is more (or less) than the program catalog/bounds.yaml names under `key`
    reads; None when it reads it."""
    low, high = number_range(key)
    if low <= value <= high:
        return None
    row = reader(key)
    why = f"; {row.why}" if row.why else ""
    more = value > high
    give = f"at most {high}" if more else f"at least {low}"
    return (f"{what or shown(value)} is {'more' if more else 'less'} than {row.reader} can read: it reads "
            f"{TYPE_WORDS.get(row.type, row.type)}{why} ({row.source}); give {give}")


@dataclass(frozen=True)
class ReadBy:
    """An integer that another program reads (catalog/bounds.yaml, `key`): a value outside the
    type that program reads it as is refused, naming the program and where its type is written."""

    key: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        problem = out_of_range(self.key, value) if isinstance(value, int) else None
        if problem:
            raise ValueError(problem)
        return value


def _index_key(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError(f"takes a member index, a whole number like 3 (got {shown(value)})")


# A map's key that is a member's index. A YAML key 3 is a number, but the same value read by
# the Pulumi program (pulumi.Config, as JSON) has the text "3": JSON object keys are always
# text. Both are the index; a boolean or any other text is not.
IndexKey = Annotated[int, BeforeValidator(_index_key)]


def _text_only(value: Any) -> Any:
    if not isinstance(value, str | IPv4Network):
        raise ValueError(f"takes a CIDR in quotes or plain, like '10.0.0.0/16' (got {shown(value)})")
    return value


# a network as text (or one already made): pydantic would also make one from a YAML integer
# (167772160 -> 10.0.0.0/32)
Cidr = Annotated[IPv4Network, BeforeValidator(_text_only)]

# --- paths -------------------------------------------------------------------------------------
# A path component: what a mount point, a device link or a log file needs, and nothing a unit
# file (whitespace, `%` specifiers, `$` variables), a shell (quotes, `$(...)`, `;`, globs) or
# cloud-init's mounts list would read as anything but part of the path.
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
PATH_MAX = 200
# Directories of the operating system itself: a local disk mounted there hides it, a log file
# written there overwrites it.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")
# Where the node's programs keep their state (cloud-init's instance data, which a hidden or
# overwritten copy makes it run first boot again; the kubelet's pods, certificates and device
# plugin sockets; the runtimes' images, preloaded into the image; packages, cron, logs; the CNI
# plugins and NVIDIA's topology files under /opt), and the world-writable folders, where another
# user can plant a link for a root writer to follow. A mount on one hides what the image put
# there; a mount above one (/opt, /var/lib) hides it too; a log file in one overwrites it.
# /var/run and /var/lock are links into /run. tests/config/test_paths.py checks that every folder
# a rendered file names is here or in SYSTEM_DIRS.
STATE_DIRS = (
    "/var/lib/cloud", "/var/lib/kubelet", "/var/lib/kube-proxy", "/var/lib/docker", "/var/lib/containerd",
    "/var/lib/etcd", "/var/lib/kilonode", "/var/lib/kilonode-etcd", "/var/lib/dpkg", "/var/lib/apt",
    "/var/lib/systemd", "/var/lib/dbus", "/var/lib/dhcp", "/var/lib/private", "/var/log", "/var/spool", "/var/cache",
    "/var/mail", "/var/backups", "/var/run", "/var/lock", "/var/tmp", "/tmp", "/root", "/home", "/opt/cni",
    "/opt/microsoft", "/opt/kilonode", "/opt/kilonode-nccl", "/lost+found",
)
# Folders under /var/log that the kubelet and journald own: an audit log there collides with their files.
OWNED_LOG_DIRS = ("/var/log/journal", "/var/log/pods", "/var/log/containers", "/var/log/private")


def _absolute_path(value: str) -> str:
    if len(value) > PATH_MAX:
        raise ValueError(f"is {len(value)} characters long; a path here has at most {PATH_MAX} (got {shown(value)})")
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, starting with '/' (got {shown(value)})")
    parts = value[1:].split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"must be a normalised absolute path: no '.', '..', '//' or trailing '/' (got {shown(value)})")
    bad = next((p for p in parts if not re.fullmatch(_COMPONENT, p)), None)
    if bad is not None:
        raise ValueError(
            f"may hold only letters, digits and '.', '_', '-' between its '/': no whitespace, control characters, "
            f"quotes or $ ; % ` * (got {shown(value)})"
        )
    return value


def _under(value: str, folders: tuple[str, ...]) -> str | None:
    return next((f for f in folders if value == f or value.startswith(f + "/")), None)


def _hidden(value: str) -> str | None:
    """The system or state folder a mount at `value` would hide (or fall inside), if any."""
    return _under(value, SYSTEM_DIRS + STATE_DIRS) or next(
        (d for d in STATE_DIRS if d.startswith(value + "/")), None)


def _mount_point(value: str) -> str:
    hidden = _hidden(value)
    if hidden is not None:
        raise ValueError(f"{value} would hide {hidden}, which the operating system or a node program keeps its files "
                         "in; mount the local disk at a folder of its own, like /mnt/local-ssd")
    return value


# Block devices by a name that stays with the disk (kilonode.config.values._device). A local disk
# is formatted at first boot, so the name must never turn out to be the OS disk: the kernel
# names SCSI and NVMe disks in the order it finds them, and on Azure the OS disk can come up as
# /dev/sdb ("Troubleshoot Linux VM device name changes", learn.microsoft.com/troubleshoot/azure/
# virtual-machines/linux/troubleshoot-device-names-problems), or as an NVMe namespace on the sizes
# whose OS disk is NVMe. Kept: cloud-init's link to the temp disk (66-azure-ephemeral.rules, the
# default), udev's /dev/disk/by-id links (60-persistent-storage.rules: the disk's own serial), and
# the rehearsal's virtio disks after /dev/vda (its root; kilonode.local).
STABLE_DEVICES = (
    r"/dev/disk/cloud/azure_resource(-part[0-9]+)?",
    r"/dev/disk/by-id/[A-Za-z0-9][A-Za-z0-9._-]*",
    r"/dev/vd([b-z]|[a-z]{2})[0-9]*",
)
# The OS disk under the names it has on Azure and in the rehearsal.
OS_DISKS = (r"/dev/(sda|vda|xvda|hda|mmcblk0)(p?[0-9]+)?", r"/dev/root", r"/dev/disk/cloud/azure_root(-part[0-9]+)?",
            r"/dev/disk/azure/(root|os)(-part[0-9]+)?")
# Names the kernel hands out in the order it finds disks: stable on no Azure VM.
UNSTABLE_DISKS = r"/dev/(sd[a-z]+|nvme[0-9]+n[0-9]+|xvd[a-z]+|hd[a-z]+)(p?[0-9]+)?"


def _device(value: str) -> str:
    accepted = "/dev/disk/cloud/azure_resource (the temp disk, the default) or a /dev/disk/by-id/ link"
    if any(re.fullmatch(pattern, value) for pattern in OS_DISKS):
        raise ValueError(f"{value} is the OS disk: the local disk is formatted at first boot, which would destroy the "
                         f"machine's root file system; name {accepted}")
    if re.fullmatch(UNSTABLE_DISKS, value):
        raise ValueError(f"{value} is a name the kernel gives disks in the order it finds them: on Azure the OS disk "
                         "can take it on another boot (learn.microsoft.com/troubleshoot/azure/virtual-machines/linux/"
                         f"troubleshoot-device-names-problems), and it is formatted at first boot; name {accepted}")
    if not any(re.fullmatch(pattern, value) for pattern in STABLE_DEVICES):
        raise ValueError(f"{shown(value)} is not a disk by a stable name (a memory or character device, a folder, a "
                         f"partition table's link?): it is formatted at first boot; name {accepted}")
    return value


def log_file_problem(value: str) -> str | None:
    """Why the audit log may not be written at `value`, whatever the apiserver's disk."""
    owned = _under(value, OWNED_LOG_DIRS)
    if owned is not None:
        return f"{value} is under {owned}, whose files the kubelet or journald own; write the log in a folder of " \
            "its own"
    system = _under(value, SYSTEM_DIRS + tuple(d for d in STATE_DIRS if d != "/var/log"))
    if system is not None or value == "/var/log":
        return (f"{value} is under {system or value}, which the operating system or a node program keeps its files in "
                "(a root writer there overwrites them, or follows a link another user planted); write the log on the "
                "local disk or in a folder of its own under /var/log")
    return None


def _log_file(value: str) -> str:
    problem = log_file_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _relative_path(value: str) -> str:
    if len(value) > PATH_MAX:
        raise ValueError(f"is {len(value)} characters long; a path here has at most {PATH_MAX} (got {shown(value)})")
    if value.startswith("/"):
        raise ValueError(f"must be relative to the stack's project folder (the folder of its Pulumi.yaml), not "
                         f"absolute (got {shown(value)})")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"must be a normalised relative path inside the project: no '.', '..', '//' or trailing "
                         f"'/' (got {shown(value)})")
    if not all(re.fullmatch(_COMPONENT, part) for part in parts):
        raise ValueError(f"may hold only letters, digits and '.', '_', '-' between its '/' (got {shown(value)})")
    return value


_PATH_WORDS = "absolute, normalised (no `.`, `..`, `//`, trailing `/`), letters, digits, `._-` between `/`"
AbsolutePath = Annotated[str, Strict(), AfterValidator(_absolute_path), Accepts(_PATH_WORDS)]
MountPoint = Annotated[AbsolutePath, AfterValidator(_mount_point), Accepts(
    f"{_PATH_WORDS}; not `/`, a system folder (`/etc`, `/usr`, ...) or a node program's state (`/var/lib/kubelet`, "
    "`/var/lib/cloud`, `/opt/cni`, ...), nor above one (`/var`, `/opt`)")]
DevicePath = Annotated[AbsolutePath, AfterValidator(_device), Accepts(
    f"{_PATH_WORDS}; a disk by a stable name: `/dev/disk/cloud/azure_resource`, `/dev/disk/by-id/...` (the "
    "rehearsal: `/dev/vdb`); never the OS disk, `/dev/sdX` or `/dev/nvmeXnY`")]
LogFile = Annotated[AbsolutePath, AfterValidator(_log_file), Accepts(
    f"{_PATH_WORDS}; below the apiserver's localDisk.mountPoint or in a folder of its own under `/var/log`")]
RelativePath = Annotated[str, Strict(), AfterValidator(_relative_path), Accepts(
    "relative to the project folder, inside it (no `..`), letters, digits, `._-` between `/`; the file must exist")]

# --- etcd ----------------------------------------------------------------------------------------


_NS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000}
DURATION = r"([0-9]+(\.[0-9]+)?(h|m|s|ms))+"


def duration_ns(value: str) -> int:
    """A Go duration's length in nanoseconds, as time.ParseDuration adds it up (units h, m, s,
    ms; a fraction truncated to whole nanoseconds)."""
    total = 0
    for number, unit in re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)", value):
        whole, _, fraction = number.partition(".")
        total += int(whole) * _NS[unit]
        if fraction:
            total += int(fraction) * _NS[unit] // 10 ** len(fraction)
    return total


def duration_problem(key: str, value: str) -> str | None:
    """Why the Go duration `value` is longer than the reader `key` holds (catalog/bounds.yaml)."""
    return out_of_range(key, duration_ns(value), f"{shown(value)} ({duration_ns(value):,} ns)")


def _retention(value: str) -> str:
    # etcd --auto-compaction-retention: hours as a number, or a Go duration (1h, 30m, 1h30m)
    if len(value) > 32 or not re.fullmatch(rf"[0-9]+|{DURATION}", value):
        raise ValueError(f"must be hours as a number or a duration like '1h', '30m', '1h30m' (got {shown(value)})")
    problem = (out_of_range("etcdAutoCompactionRetentionHours", int(value), f"{value} hours") if value.isdigit()
               else duration_problem("etcdAutoCompactionRetentionDuration", value))
    if problem:
        raise ValueError(problem)
    return value


Retention = Annotated[str, Strict(), AfterValidator(_retention), Accepts(
    "hours as a number, or a duration: `1h`, `30m`; no longer than etcd reads (catalog/bounds.yaml)")]


def _pull_deadline(value: str) -> str:
    # the pattern (digits and one unit) is the field's own; the length is the runtimes' reading
    if len(value) > 32:
        raise ValueError(f"is {len(value)} characters long; a duration here has at most 32 (got {shown(value)})")
    if not re.fullmatch(DURATION, value):
        return value  # the field's pattern says what it takes
    low, _ = number_range("imagePullProgressDeadline")
    if duration_ns(value) < low:
        row = reader("imagePullProgressDeadline")
        raise ValueError(f"{shown(value)} is shorter than {low // _NS['m']}m, the least kilonode gives "
                         f"{row.reader}: {row.why} ({row.source}); give 1m or more, or leave it out (30m)")
    problem = duration_problem("imagePullProgressDeadline", value)
    if problem:
        raise ValueError(problem)
    return value


PullDeadline = Annotated[str, Strict(), AfterValidator(_pull_deadline)]


def _gallery_version(value: str) -> str:
    parts = value.split(".")
    if not all(part.isdigit() for part in parts):
        return value  # the field's pattern says what it takes
    for part in parts:
        if len(part) > 1 and part.startswith("0"):
            raise ValueError(f"{shown(value)}: write each part without leading zeros ({part} is {int(part)}): "
                             "Azure reads every part as a number, so two spellings would name one version")
        problem = out_of_range("galleryImageVersionPart", int(part), f"part {part} of {shown(value)}")
        if problem:
            raise ValueError(problem)
    return value


GalleryVersion = Annotated[str, Strict(), AfterValidator(_gallery_version), Accepts(
    "`Major.Minor.Patch`, each part a number from 0 to 2147483647 without leading zeros (Azure: a 32-bit integer)")]

# --- sysctl --------------------------------------------------------------------------------------
SYSCTL_KEY = r"[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+"
# A string value: words of letters, digits and `_ . , : -`, single spaces between them (a port
# range "1024 65535", a qdisc "fq"). Never a path or a pipe: kernel.core_pattern `|prog` or
# kernel.modprobe `/path` would run a program as root, and a line break would add a setting.
SYSCTL_WORDS = r"[A-Za-z0-9_.,:-]+( [A-Za-z0-9_.,:-]+)*"


def _sysctl_key(value: str) -> str:
    if len(value) > 128 or not re.fullmatch(SYSCTL_KEY, value):
        raise ValueError(f"{shown(value)} is not a sysctl name like 'net.ipv4.ip_forward'")
    return value


def _sysctl_value(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"takes an integer, or words of letters and digits (got {shown(value)})")
    if isinstance(value, str) and (len(value) > 128 or not re.fullmatch(SYSCTL_WORDS, value)):
        raise ValueError(
            "a string value is words of letters, digits and '_ . , : -', single spaces between them: no path, "
            f"pipe, quote, line break or control character (got {shown(value)})"
        )
    return value


SysctlKey = Annotated[str, Strict(), AfterValidator(_sysctl_key)]
SysctlValue = Annotated[int | str, BeforeValidator(_sysctl_value), Accepts(
    "an integer (for a key the profile gives an integer), or words of letters, digits and `_.,:-`")]

# --- Kubernetes labels and taints ----------------------------------------------------------------
# k8s.io/apimachinery/pkg/util/validation/validation.go: a label key is IsQualifiedName (an
# optional DNS-1123 subdomain prefix of at most 253 characters, "/", then a name of at most 63
# characters), a label value IsValidLabelValue.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = rf"({QUALIFIED_NAME})?"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# The kubelet refuses to start with --node-labels in kubernetes.io/ or k8s.io/ beyond its own few
# (k8s.io/kubelet's IsKubeletLabel), and kilonode.io/ is kilonode's own: kilonode.io/pool,
# /team, /system, /fabric and /nccl-topology place workloads and teams, and a stack's label
# would override the tool's. Taints there are Kubernetes' controllers' and kilonode's (the team
# taint, the GPU health startup taint).
RESERVED_PREFIXES = ("kubernetes.io", "k8s.io", "kilonode.io")


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (len(prefix) > 253 or not re.fullmatch(DNS_SUBDOMAIN, prefix)):
        return (f"{shown(key)} is not a label key: its prefix before '/' must be a DNS subdomain (lowercase "
                "letters, digits, '-' and '.')")
    if len(name) > 63 or not re.fullmatch(QUALIFIED_NAME, name):
        return (f"{shown(key)} is not a label key like 'example.com/team': the name has at most 63 of "
                "[A-Za-z0-9_.-], alphanumeric at both ends")
    return None


def reserved(key: str) -> str | None:
    """The reserved prefix `key` is under, if any."""
    prefix = key.rpartition("/")[0]
    return next((r for r in RESERVED_PREFIXES if prefix == r or prefix.endswith("." + r)), None)


def _label_key(value: str) -> str:
    problem = label_key_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _own_label_key(value: str) -> str:
    prefix = reserved(value)
    if prefix is not None:
        raise ValueError(f"{value}: labels under {prefix}/ are not the stack's to set (the kubelet refuses most of "
                         "them, and kilonode sets its own); use a prefix of your own, like example.com/")
    return value


def _label_value(value: str) -> str:
    if len(value) > 63 or not re.fullmatch(LABEL_VALUE, value):
        raise ValueError(f"label value {shown(value)}: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends")
    return value


def _taint(value: str) -> str:
    match = re.fullmatch(r"(?P<key>[^=:]+)(=(?P<value>[^=:]*))?:(?P<effect>[A-Za-z]+)", value)
    if not match or match["effect"] not in TAINT_EFFECTS:
        raise ValueError(f"{shown(value)} is not a taint like 'nvidia.com/gpu=present:NoSchedule' (key[=value]:effect, "
                         f"the effect one of {', '.join(TAINT_EFFECTS)})")
    problem = label_key_problem(match["key"])
    if problem:
        raise ValueError(f"taint {problem}")
    _label_value(match["value"] or "")
    prefix = reserved(match["key"])
    if prefix is not None:
        raise ValueError(f"{value}: taints under {prefix}/ belong to Kubernetes' controllers and kilonode (team and "
                         "GPU health taints); use a key of your own, like example.com/dedicated")
    return value


def taint_key_effect(taint: str) -> tuple[str, str]:
    """A taint's identity: Kubernetes allows one taint per key and effect on a node."""
    key_value, _, effect = taint.rpartition(":")
    return key_value.split("=", 1)[0], effect


LabelKey = Annotated[str, Strict(), AfterValidator(_label_key)]
PoolLabelKey = Annotated[LabelKey, AfterValidator(_own_label_key)]
LabelValue = Annotated[str, Strict(), AfterValidator(_label_value)]
Taint = Annotated[str, Strict(), AfterValidator(_taint), Accepts(
    "`key[=value]:Effect`, key and value as labels' (apimachinery); no key under `kubernetes.io/`, `k8s.io/`, "
    "`kilonode.io/`")]

# --- Azure names ---------------------------------------------------------------------------------
VmSize = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_]{1,64}$")]

# --- certificates --------------------------------------------------------------------------------
# A control-plane host as the plan names it (kilonode.plan.resolve): an etcd member of any
# cluster or an apiserver, by index. Whether the index exists is checked against the stack's
# member counts (kilonode.config.checks).
CONTROL_PLANE_HOST = r"(etcd-main|etcd-events|etcd-leases|apiserver)-(0|[1-9][0-9]?)"
# A renewal generation: a count an operator bumps by one per renewal; far below any limit, and
# small enough that a typo (a date, a serial) stands out.
MAX_GENERATION = 10_000


def _control_plane_host(value: str) -> str:
    if not re.fullmatch(CONTROL_PLANE_HOST, value):
        raise ValueError(f"{shown(value)} is not a control-plane host: etcd-main-N, etcd-events-N, etcd-leases-N or "
                         "apiserver-N "
                         "(N the member's index, as `kilonode explain` and the rendered host folders name them)")
    return value


def _generation(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GENERATION:
        raise ValueError(f"takes a whole number from 0 to {MAX_GENERATION}, one more than the last renewal "
                         f"(got {shown(value)})")
    return value


ControlPlaneHost = Annotated[str, Strict(), AfterValidator(_control_plane_host)]
Generation = Annotated[int, BeforeValidator(_generation), Accepts(f"a whole number, 0 to {MAX_GENERATION}")]


# --- SSH ---------------------------------------------------------------------------------------
# An operator's OpenSSH public key, one authorized_keys line as `ssh-keygen` writes it: type, the
# base64 key blob (RFC 4253 section 6.6: its first field repeats the type), an optional comment.
# Azure writes the line to the admin user's authorized_keys, so no option prefix (`command=...`)
# and no control character. The key types Azure takes and what makes a key too weak are
# catalog/ssh_keys.yaml's, judged by kilonode.config.keys.
SSH_KEY_MAX = 4096


def _ssh_fields(blob: bytes) -> list[bytes]:
    fields, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("truncated")
        size = int.from_bytes(blob[at:at + 4], "big")
        if at + 4 + size > len(blob):
            raise ValueError("truncated")
        fields.append(blob[at + 4:at + 4 + size])
        at += 4 + size
    return fields


def _ssh_key_problem(kind: str, fields: list[bytes]) -> str | None:
    """Why the key's own numbers make it no key to trust (kilonode.config.keys), if they do."""
    if kind == "ssh-rsa":
        if len(fields) != 3:
            return "an ssh-rsa key holds an exponent and a modulus, nothing else"
        e, n = (int.from_bytes(f, "big", signed=True) for f in fields[1:])
        return "its RSA numbers are negative" if e <= 0 or n <= 0 else rsa_problem(e, n)
    if len(fields) != 2 or len(fields[1]) != 32:
        return "an ssh-ed25519 key holds 32 bytes"
    return ed25519_problem(fields[1])


def _ssh_public_key(value: str) -> str:
    if len(value) > SSH_KEY_MAX:
        raise ValueError(f"is {len(value)} characters long; an OpenSSH public key line has at most {SSH_KEY_MAX} "
                         f"(got {shown(value)})")
    match = re.fullmatch(r"(?P<type>[a-z0-9@.-]+) (?P<blob>[A-Za-z0-9+/]+={0,2})( (?P<comment>[ -~]*))?", value)
    example = "an OpenSSH public key line like 'ssh-ed25519 AAAAC3Nz... alice@example.com' (the .pub file's one line)"
    if match is None:
        raise ValueError(f"is not {example}: no options, no line break or control character (got {shown(value)})")
    types = ssh_key_rules().types.value
    if match["type"] not in types:
        raise ValueError(f"key type {shown(match['type'])} is not one Azure takes for Linux VMs: use "
                         f"{' or '.join(types)} ({ssh_key_rules().types.source})")
    try:
        fields = _ssh_fields(base64.b64decode(match["blob"], validate=True))
    except ValueError:
        raise ValueError(f"the key data of {shown(value)} is not valid base64 of an SSH key") from None
    if not fields or fields[0].decode("ascii", "replace") != match["type"]:
        raise ValueError(f"the key data says another type than {match['type']} (got {shown(value)})")
    problem = _ssh_key_problem(match["type"], fields) or parsed_problem(value, match["type"])
    if problem:
        raise ValueError(f"{problem} (got {shown(value)}); give the .pub line of a key made by ssh-keygen "
                         "(ssh-keygen -t ed25519)")
    return value


SshPublicKey = Annotated[str, Strict(), AfterValidator(_ssh_public_key), Accepts(
    "one OpenSSH public key line (`ssh-ed25519`, or `ssh-rsa` of 2048 to 16384 bits with a standard exponent), "
    "no options; a key whose numbers are degenerate (a small-order Ed25519 point, an RSA modulus anyone can factor) "
    "is refused")]
