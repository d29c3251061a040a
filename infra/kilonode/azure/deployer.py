"""What the machine running `pulumi up` must have before the program creates anything: the
command-line tools the program's own commands run, at versions that work, logged in, and the
subscription features the graph relies on. Checked by the program (kilonode.azure.program)
before it registers a resource; docs/azure.md, "Before the first run", lists the same.

- `kubectl`: the readiness gate (kilonode.k8s.readiness) runs it against the new apiserver.
  Kubernetes' version skew policy: "kubectl is supported within one minor version (older or
  newer) of kube-apiserver" (kubernetes/website content/en/releases/version-skew-policy.md).
  Without it the gate retries for its whole deadline and blames the apiserver.
- `az`, logged in: the VHD uploads (kilonode.azure.node_image) run `az storage blob upload
  --auth-mode login` as the signed-in identity (`az account show` fails when none is).
- the EncryptionAtHost feature of Microsoft.Compute, Registered, where any machine uses
  encryption at host: Azure refuses such a VM otherwise ("Disks: encryption at host",
  docs/azure.md).
- `deployer.cidrs` holding the deployer's real addresses: a documentation range (RFC 5737, the
  shipped stacks' placeholder) is admitted by the image account's firewall and the apiserver's
  public frontend, but no real machine sends from it: the uploads are refused after minutes of
  retries, then the readiness gate times out. (Preflight, which runs offline on the shipped
  stacks, only warns of it.)
- the subscription's vCPU quota in the region, per family and in total (`az vm list-usage`:
  limit less current value), at least what the plan's machines take (plan.vcpu_quota): a new
  subscription's GPU families are at 0, and a scale set over quota fails half-way through a run.
- every VM size of the plan offered in the stack's region to this subscription: `az vm
  list-skus --location L --size S --all` lists the size there, with a `Location` restriction
  (reasonCode NotAvailableForSubscription) where the subscription may not use it. The
  catalogue cannot say where Microsoft sells the GPU sizes (catalog/vm_regions.yaml: not
  recorded); Azure itself answers here, before a scale set fails half-way through a run.

Every problem is collected and told at once, each with what to do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_network

# Each tool call is bounded: a hung CLI must not hang `pulumi up` before it has started.
TOOL_TIMEOUT_S = 60
KUBECTL_SKEW_MINORS = 1  # the version skew policy's kubectl bound
# RFC 5737's documentation ranges: no real machine sends from them (preflight's deployer-path too).
DOCUMENTATION = tuple(ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))


@dataclass(frozen=True)
class Answer:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], Answer]


def run_tool(argv: Sequence[str]) -> Answer:
    """Run one tool call, bounded; a timeout or a missing binary is a failed answer."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Answer(127, "", str(error))
    return Answer(done.returncode, done.stdout, done.stderr)


def _kubectl(kubernetes_version: str, run: Runner) -> list[str]:
    if shutil.which("kubectl") is None:
        return ["kubectl is not on PATH: the readiness gate runs it against the new apiserver (install kubectl "
                f"{_minor(kubernetes_version)}, within one minor of the cluster's Kubernetes {kubernetes_version})"]
    answer = run(["kubectl", "version", "--client", "-o", "json"])
    try:
        client = json.loads(answer.stdout)["clientVersion"]
        minor = int(str(client["minor"]).rstrip("+"))
        major = int(client["major"])
    except (ValueError, KeyError, TypeError):
        return [f"`kubectl version --client -o json` gave no version (exit {answer.returncode}): "
                f"{(answer.stderr or answer.stdout).strip()[:200]}"]
    cluster_major, cluster_minor = (int(x) for x in kubernetes_version.split(".")[:2])
    if major != cluster_major or abs(minor - cluster_minor) > KUBECTL_SKEW_MINORS:
        return [f"kubectl is {major}.{minor}, more than {KUBECTL_SKEW_MINORS} minor from the cluster's Kubernetes "
                f"{kubernetes_version} (the version skew policy supports kubectl within one minor of the "
                f"apiserver): install kubectl {_minor(kubernetes_version)}"]
    return []


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _az(run: Runner) -> list[str]:
    if shutil.which("az") is None:
        return ["az (the Azure CLI) is not on PATH: the node-image uploads run `az storage blob upload "
                "--auth-mode login`; install it and `az login` as the identity `pulumi up` runs as"]
    answer = run(["az", "account", "show", "-o", "json"])
    if answer.returncode != 0:
        return [f"az is not logged in (`az account show`: {answer.stderr.strip()[:200] or answer.returncode}): "
                "`az login`, then `az account set --subscription <id>`"]
    return []


def _encryption_at_host(run: Runner) -> list[str]:
    answer = run(["az", "feature", "show", "--namespace", "Microsoft.Compute", "--name", "EncryptionAtHost",
                  "--query", "properties.state", "-o", "tsv"])
    state = answer.stdout.strip()
    if answer.returncode != 0 or state != "Registered":
        return [f"the subscription's Microsoft.Compute/EncryptionAtHost feature is {state or 'not readable'}: Azure "
                "refuses VMs with encryption at host until it is Registered: `az feature register --namespace "
                "Microsoft.Compute --name EncryptionAtHost`, wait for Registered, then `az provider register "
                "--namespace Microsoft.Compute`"]
    return []


def _sizes_offered(location: str, sizes: Sequence[str], run: Runner, zones: Sequence[str] = (),
                   encryption_at_host: Sequence[str] = ()) -> list[str]:
    """Each size offered in the region to this subscription, in every zone the plan puts it in,
    with encryption at host where the plan turns it on (the SKU's EncryptionAtHostSupported)."""
    problems = []
    for size in sizes:
        answer = run(["az", "vm", "list-skus", "--location", location, "--size", size, "--all",
                      "--resource-type", "virtualMachines", "-o", "json"])
        try:
            skus = [sku for sku in json.loads(answer.stdout) if sku.get("name") == size]
        except (ValueError, AttributeError):
            problems.append(f"`az vm list-skus --location {location} --size {size}` gave no list (exit "
                            f"{answer.returncode}): {answer.stderr.strip()[:200]}")
            continue
        if not skus:
            problems.append(f"{size} is not offered in {location} (`az vm list-skus --location {location} --size "
                            f"{size} --all` lists none): choose a region that has it, or another size")
            continue
        problems += _sku_problems(size, location, skus, zones, size in encryption_at_host)
    return problems


def _sku_problems(size: str, location: str, skus: Sequence[dict[str, object]], zones: Sequence[str],
                  encryption_at_host: bool) -> list[str]:
    restrictions = [r for sku in skus for r in sku.get("restrictions") or []]  # type: ignore[attr-defined]
    refused = [r for r in restrictions if r.get("type") == "Location"]
    if refused:
        return [f"{size} exists in {location} but not for this subscription "
                f"({refused[0].get('reasonCode', 'restricted')}): ask Azure support to enable it there, "
                "or choose another region"]
    problems = []
    offered = {str(z) for sku in skus for info in sku.get("locationInfo") or []  # type: ignore[attr-defined]
               for z in info.get("zones") or []}
    closed = {str(z) for r in restrictions if r.get("type") == "Zone"
              for z in (r.get("restrictionInfo") or {}).get("zones") or []}
    missing = sorted(set(zones) - (offered - closed)) if offered else []
    if missing:
        problems.append(f"{size} is not offered to this subscription in zone(s) {', '.join(missing)} of {location}, "
                        "where the plan puts scale sets: ask Azure support, or give the stack other zones")
    capabilities = {c.get("name"): str(c.get("value")) for sku in skus
                    for c in sku.get("capabilities") or []}  # type: ignore[attr-defined]
    if encryption_at_host and capabilities.get("EncryptionAtHostSupported") == "False":
        problems.append(f"{size} does not support encryption at host (its EncryptionAtHostSupported capability), "
                        "which the plan turns on for it: Azure refuses those VMs")
    return problems


def family_key(name: str) -> str:
    """A quota family as the usage API's name.value and the catalogue's label both reduce to:
    Azure compares them without case, and the catalogue's labels carry spaces
    ("Standard NDASv4_A100 Family" for standardNDASv4_A100Family)."""
    return name.replace(" ", "").lower()


def documentation_cidrs(cidrs: Sequence[IPv4Network]) -> list[str]:
    """The deployer ranges that are documentation placeholders."""
    return [str(c) for c in cidrs if any(c.subnet_of(doc) for doc in DOCUMENTATION)]  # type: ignore[arg-type]


def _quota(location: str, needs: Sequence[tuple[str, int]], run: Runner) -> list[str]:
    answer = run(["az", "vm", "list-usage", "--location", location, "-o", "json"])
    try:
        free = {family_key(u["name"]["value"]): int(u["limit"]) - int(u["currentValue"])
                for u in json.loads(answer.stdout)}
    except (ValueError, KeyError, TypeError):
        return [f"`az vm list-usage --location {location}` gave no usage list (exit {answer.returncode}): "
                f"{answer.stderr.strip()[:200]}"]
    short = [(family, need, free.get(family_key(family), 0)) for family, need in needs
             if need > free.get(family_key(family), 0)]
    return [f"vCPU quota in {location}: {family} has {have:,} free, the stack's machines take {need:,}: request "
            "more (Azure portal, Quotas) before the run, or a scale set fails half-way through it"
            for family, need, have in short]


def deployer_problems(kubernetes_version: str, encryption_at_host: bool, run: Runner = run_tool,
                      location: str = "", sizes: Sequence[str] = (), quota: Sequence[tuple[str, int]] = (),
                      cidrs: Sequence[IPv4Network] = (), zones: Sequence[str] = ()) -> list[str]:
    """What this machine lacks to run the program; [] when nothing."""
    placeholders = documentation_cidrs(cidrs)
    addresses = [f"deployer.cidrs holds {', '.join(placeholders)}, a documentation range (RFC 5737) no real machine "
                 "sends from: the image uploads and the apiserver admit only deployer.cidrs; put this machine's "
                 "egress addresses there (`curl -s https://ifconfig.me` shows one), or use `network: peered`"
                 ] if placeholders else []
    az = _az(run)
    # read through az, as the signed-in identity: only once that works
    feature = _encryption_at_host(run) if encryption_at_host and not az else []
    offered = _sizes_offered(location, sizes, run, zones, sizes if encryption_at_host else ()) \
        if location and not az else []
    short = _quota(location, quota, run) if location and quota and not az else []
    return addresses + _kubectl(kubernetes_version, run) + az + feature + offered + short
