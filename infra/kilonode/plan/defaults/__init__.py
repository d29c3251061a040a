"""Built-in choices that are not stack settings, one module per component, each named once
with its reason and read by the planner (kilonode.plan.resolve), the renderers and the Azure
and in-cluster components (UPPER_CASE constants only: what a component runs and every number
derived from the plan come from the plan itself). Listed in docs/stack-files.md ("Built-in defaults").
Change one here, run `make golden`, and the review shows every file it reaches.

Outside facts (what Azure, Kubernetes or a project documents) are not here: kilonode.catalog.
"""

from kilonode.plan.defaults.access import *  # noqa: F403
from kilonode.plan.defaults.alertmanager import *  # noqa: F403
from kilonode.plan.defaults.autoscaler import *  # noqa: F403
from kilonode.plan.defaults.awaits import *  # noqa: F403
from kilonode.plan.defaults.cloud_provider import *  # noqa: F403
from kilonode.plan.defaults.controllers import *  # noqa: F403
from kilonode.plan.defaults.disks import *  # noqa: F403
from kilonode.plan.defaults.dns import *  # noqa: F403
from kilonode.plan.defaults.etcd_snapshot import *  # noqa: F403
from kilonode.plan.defaults.exporters import *  # noqa: F403
from kilonode.plan.defaults.flowcontrol import *  # noqa: F403
from kilonode.plan.defaults.gpu import *  # noqa: F403
from kilonode.plan.defaults.joins import *  # noqa: F403
from kilonode.plan.defaults.metrics_server import *  # noqa: F403
from kilonode.plan.defaults.monitoring import *  # noqa: F403
from kilonode.plan.defaults.network import *  # noqa: F403
from kilonode.plan.defaults.node import *  # noqa: F403
from kilonode.plan.defaults.pod_security import *  # noqa: F403
from kilonode.plan.defaults.priorities import *  # noqa: F403
from kilonode.plan.defaults.proxy import *  # noqa: F403
