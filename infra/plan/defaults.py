"""Built-in choices that are not stack settings: named once here with their reasons, read by
the renderers and the Azure components, and listed in the README ("Built-in defaults").
Change one here, run `make golden`, and the review shows every file it reaches."""

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

# Certificates (pulumi-tls, ECDSA P-256): CAs for ten years; leaves for one year, re-issued
# by the first `pulumi up` in their last 30 days, which re-delivers them through custom data
# (a control-plane VM replacement, one member at a time: see the README).
CA_VALIDITY_HOURS = 10 * 365 * 24
LEAF_VALIDITY_HOURS = 365 * 24
LEAF_RENEW_BEFORE_HOURS = 30 * 24

# Container logs on every node (Docker's json-file driver; the kubelet's containerLogMax*
# for containerd): 3 files of 100 MiB per container, so a chatty training job cannot fill
# the OS disk.
CONTAINER_LOG_MAX_SIZE = "100Mi"
CONTAINER_LOG_MAX_FILES = 3
