"""Addresses inside the planned subnets and the apiservers' load balancer."""

# Static addresses inside the planned subnets (offsets from the network address; Azure's
# reserved .0-.3 come first). Fixed so that a member keeps its IP across plan changes.
LB_FRONTEND_OFFSET = 4
APISERVER_FIRST_OFFSET = 10
ETCD_MAIN_FIRST_OFFSET = 10
ETCD_EVENTS_FIRST_OFFSET = 20
# the optional leases cluster (etcd.leases): past every address main and events may take (each
# at most 7 members, .10-.16 and .20-.26), so adding or removing it moves no other member
ETCD_LEASES_FIRST_OFFSET = 30
CONTROL_SUBNET_PREFIX = 24

# The Azure load balancer's health probe on each apiserver: HTTPS GET /readyz, which the
# apiserver answers anonymously (AuthenticationConfiguration, KEP-4633) and which turns
# 500 while it cannot reach etcd, so a cut-off apiserver leaves the pool within
# LB_PROBE_INTERVAL_S x LB_PROBE_THRESHOLD = 10 s.
LB_PROBE_PATH = "/readyz"
LB_PROBE_INTERVAL_S = 5
LB_PROBE_THRESHOLD = 2
# Watches are long-lived: reset idle connections after 30 min (Azure's maximum) with a TCP
# reset rather than dropping them silently, so clients re-watch at once.
LB_IDLE_TIMEOUT_MIN = 30
