"""Programs that run ON a machine (a node, an etcd member, an apiserver, a VM under test), not
where clusters are built: the GPU health agent and taint controller (gpu/), the etcd snapshot
job (etcd_snapshot.py), the per-pod traffic counters (pod_traffic.py), the local-disk setup
(local_disk_setup.py) and the guest half of the ARP lesson (arp_guest.py). They run under the
image's Debian python3, without the project's venv: the standard library, each other (relative
imports) and the Python libraries the node images carry, nothing else
(tests/node/test_node_imports.py enforces it). ship.py says where each one lands on the
machine and how it gets there; every image build, renderer and VM check ships them through it.
"""
