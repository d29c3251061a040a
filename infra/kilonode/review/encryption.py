"""The Secrets encryption provider that wrote every stored Secret dropped from the apiservers'
EncryptionConfiguration (`encryption-provider-dropped`, high; the independent trace 12a of
kilonode diff on research-7500: secretbox -> aesgcm in kilonode.plan.encryption was reported as
`apiservers-all` alone, since the Pulumi graph shows the new file only as a secret's new digest).

kube-apiserver stores each encrypted value with its provider and key name as a prefix
("k8s:enc:secretbox:v1:kilonode-1:..."), and reads it only with a provider of that type holding a
key of that name from its --encryption-provider-config (Kubernetes' "Encrypting Confidential Data
at Rest", kubernetes/website content/en/docs/tasks/administer-cluster/encrypt-data.md,
"Understanding the encryption at rest configuration": "the first provider in the list is used to
encrypt"; the others are tried in order to decrypt; k8s.io/apiserver pkg/storage/value
PrefixTransformers: "no matching prefix found" otherwise). A configuration that no longer lists
the base's write key leaves every Secret already in etcd unreadable: the new apiservers fail each
read of one (service account tokens, bootstrap tokens, the cloud provider's config), their
controllers and the nodes' joins with them, and `identity` last does not help (it reads only
values without a k8s:enc: prefix).

Read from plan.yaml's secretsEncryption on each side (kilonode.plan.encryption.provider_keys:
"<provider>:<key name>" in the file's order, the first writing; no key material). Silent where
either side's plan predates the field.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, Finding
from kilonode.review.lifecycle import plan_of

RULE = "encryption-provider-dropped"
FIELD = "secretsEncryption"
IDENTITY = "identity"


def _providers(plan: Mapping[str, Any]) -> list[str] | None:
    value = plan.get(FIELD)
    return [str(v) for v in value] if isinstance(value, list) else None


def assess(diff: StackDiff) -> list[Finding]:
    if diff.base is None or diff.head is None:
        return []
    before, after = _providers(plan_of(diff.base)), _providers(plan_of(diff.head))
    if not before or after is None:
        return []
    writer = before[0]
    if writer == IDENTITY or writer in after:
        return []  # nothing was encrypted, or the head still reads what the base wrote
    first = after[0] if after else "(none)"
    return [Finding(
        HIGH, RULE,
        f"Secrets encryption: the base writes every Secret with {writer} (stored as "
        f"k8s:enc:{writer.replace(':', ':v1:', 1)}:...), and the head's EncryptionConfiguration no longer lists "
        f"it ({', '.join(after) or 'no providers'}; {first} writes): every Secret already in etcd is unreadable by "
        "the new apiservers (service account and bootstrap tokens, the cloud provider's config, every workload's "
        "credentials), so they never become ready and nodes stop joining, and with every apiserver replaced the "
        "cluster has none that reads them. Rotate as Kubernetes documents it (\"Encrypting Confidential Data at "
        f"Rest\", rotating a decryption key): add {first} second, after {writer}, and roll the apiservers; make "
        f"{first} first and roll again; rewrite every Secret (`kubectl get secrets --all-namespaces -o json | "
        f"kubectl replace -f -`); only then drop {writer} (kilonode.plan.encryption; docs/azure.md, \"Secrets at "
        "rest\")",
        ("plan.yaml secretsEncryption",))]
