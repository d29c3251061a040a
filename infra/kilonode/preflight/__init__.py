"""`kilonode preflight`: the bring-up of every role and of a first workload, traced offline
across components, from what kilonode produces for a stack: the resolved plan and the
rendered host files (a `kilonode render` directory), the Pulumi program's recorded resource
graph (`kilonode plan --format json`) and, when given, built images' manifests.

Each artefact is valid against its own consumer's schema (the tests prove that); what no
single schema sees is the step between two of them: a binary a conflist names that the image
lacks, a taint no system pod tolerates, a resolver that is a loopback stub inside a pod, a
disk too small for what is written to it, a caller with no network path. Each check follows
one such chain for every role and names its first break with the fix.

One module per check under kilonode.preflight.checks, registered in CHECKS by its stable
name; each takes Inputs and returns Findings. Nothing here imports Pulumi or the renderers:
the caller (the CLI, the Pulumi program) hands over what they produced.
"""

from kilonode.preflight.model import Finding, InputError, Inputs, Level, Resource
from kilonode.preflight.run import CHECKS, Check, breaks, run

__all__ = ["CHECKS", "Check", "Finding", "InputError", "Inputs", "Level", "Resource", "breaks", "run"]
