"""What the tests read but never fetch themselves (they must not reach a package mirror):
Debian's cloud-init, unpacked into the cache for its schema validator, and promtool and the
Prometheus server from Debian's prometheus package (only usr/bin/promtool and
usr/bin/prometheus: installing the package would start a Prometheus server as a service), and
amtool from Debian's prometheus-alertmanager package (only usr/bin/amtool, likewise).
Bounded (apt-get's own timeouts, 300 s a call) and once per package version.
`make test-artefacts` and `make test-fast` run it: `python -m tests.artefacts`."""

from tests.monitoring.alertmanager_tool import amtool_path, amtool_version
from tests.monitoring.promtool import prometheus_path, promtool_path, promtool_version
from tests.render.consumers import cloud_init_dist_packages

if __name__ == "__main__":
    print(f"cloud-init for the schema tests: {cloud_init_dist_packages(fetch=True)}")
    promtool = promtool_path(fetch=True)
    print(f"promtool for the monitoring tests: {promtool} ({promtool_version(promtool)})")
    prometheus = prometheus_path(fetch=True)
    print(f"prometheus for the live etcd alert test: {prometheus} ({promtool_version(prometheus)})")
    amtool = amtool_path(fetch=True)
    print(f"amtool for the Alertmanager configuration tests: {amtool} ({amtool_version(amtool)})")
