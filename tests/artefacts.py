"""What the tests read but never fetch themselves (they must not reach a package mirror):
Debian's cloud-init, unpacked into the cache for its schema validator, and promtool from
Debian's prometheus package (only usr/bin/promtool: installing the package would start a
Prometheus server). Bounded (apt-get's own timeouts, 300 s a call) and once per package
version. `make test-artefacts` and `make test-fast` run it: `python -m tests.artefacts`."""

from tests.monitoring.promtool import promtool_path, promtool_version
from tests.render.consumers import cloud_init_dist_packages

if __name__ == "__main__":
    print(f"cloud-init for the schema tests: {cloud_init_dist_packages(fetch=True)}")
    promtool = promtool_path(fetch=True)
    print(f"promtool for the monitoring tests: {promtool} ({promtool_version(promtool)})")
