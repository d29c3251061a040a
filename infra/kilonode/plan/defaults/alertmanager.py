"""The cluster's Alertmanager (kilonode.k8s.alertmanager, kilonode.render.alertmanager): the names and
paths the renderer writes into alertmanager.yml and prometheus.yml and the pod mounts, and the routing
timers, each with its reason (docs/monitoring.md, "Alertmanager").

Alertmanager's own behaviour is read at the pinned release (catalogue components.yaml alertmanager,
prometheus/alertmanager at v0.34.0).
"""

from __future__ import annotations

# Its StatefulSet, Service and ServiceAccount; Prometheus reaches it at
# http://alertmanager.monitoring.svc:9093 (kilonode.render.monitoring's `alerting:` block).
ALERTMANAGER_NAME = "alertmanager"
# The image's EXPOSE and --web.listen-address default (cmd/alertmanager/main.go l.63 at v0.34.0: ":9093").
ALERTMANAGER_PORT = 9093
# Where the configuration ConfigMap is mounted and the file in it Alertmanager runs.
ALERTMANAGER_CONFIG_DIR = "/etc/alertmanager/kilonode"
ALERTMANAGER_CONFIG_FILE = "alertmanager.yml"
# Where the receivers' Secret is mounted: alertmanager.yml names files there (routing_key_file,
# credentials_file), so the ConfigMap, the recorded graph and the review hold no credential.
ALERTMANAGER_SECRETS_DIR = "/etc/alertmanager/secrets"
ALERTMANAGER_PAGERDUTY_KEY_FILE = "pagerduty-routing-key"
ALERTMANAGER_WEBHOOK_TOKEN_FILE = "webhook-token"
# The Pulumi config keys (namespace `kilonode`) that hold the secrets, set with
# `pulumi config set --secret`: never in `kilonode:cluster`, which takes no secret (kilonode.config.load).
ALERTMANAGER_PAGERDUTY_KEY_CONFIG = "alertingPagerDutyRoutingKey"
ALERTMANAGER_WEBHOOK_TOKEN_CONFIG = "alertingWebhookToken"

# The receivers (alertmanager.yml `receivers:`): where critical alerts go (pages), where warnings go.
RECEIVER_PAGE = "kilonode-page"
RECEIVER_NOTIFY = "kilonode-notify"
# The dead man's switch: KilonodeWatchdog fires for as long as Prometheus evaluates its rules and scrapes
# itself, and goes to this receiver alone (never a page, never the notify webhook), which POSTs it to the
# stack's `alerting.heartbeatUrl`: a service outside the cluster that alarms when the posts stop (Prometheus,
# Alertmanager, their node or the cluster's way out gone). Without the URL the receiver sends nothing.
RECEIVER_HEARTBEAT = "kilonode-heartbeat"
WATCHDOG_ALERT = "KilonodeWatchdog"
# How often the heartbeat is sent: Alertmanager sends a group that is still firing again once
# repeat_interval has passed, checked at each group_interval (dispatch/dispatch.go aggrGroup.run and
# notify.go DedupStage.needsUpdate at v0.34.0), so a post every 5 minutes; the outside service's period
# should be that with a grace of 10 minutes or more (a restart of Prometheus or Alertmanager).
HEARTBEAT_GROUP_INTERVAL = "1m"
HEARTBEAT_REPEAT = "5m"
# Grouping: one notification per alert name per cluster (an etcd quota alert for 8 members is one
# page, not eight); `cluster` is every series' external label (kilonode.render.monitoring).
ALERTMANAGER_GROUP_BY = ("cluster", "alertname")
# group_wait: how long a new group waits for the rest of its alerts before the first notification.
# The rules evaluate every 60 s and Prometheus sends firing alerts again every minute
# (--rules.alert.resend-delay, cmd/prometheus/main.go l.527 at v3.5.5): 30 s (Alertmanager's default,
# dispatch/route.go DefaultRouteOpts l.34-36 at v0.34.0) gathers what one evaluation fires without delaying a page.
ALERTMANAGER_GROUP_WAIT = "30s"
# group_interval: how soon a group already notified sends again when an alert joins or resolves. 5m
# (the default, l.35): a second etcd member crossing its quota reaches the pager within five minutes.
ALERTMANAGER_GROUP_INTERVAL = "5m"
# repeat_interval: a page still firing is sent again every 4 hours (the default, and a night's
# on-call wakes for it twice at most; the default, l.36); a warning once a day, a reminder, not noise.
ALERTMANAGER_REPEAT_CRITICAL = "4h"
ALERTMANAGER_REPEAT_WARNING = "24h"
# Silences and the notification log are kept for --data.retention (default 120h, named): an expired
# silence stays visible for five days. Their files live on a small claim (kilonode.k8s.alertmanager):
# a silence set during an incident survives the pod's restart.
ALERTMANAGER_RETENTION = "120h"
# The claim: Azure's smallest Premium SSD tier (P1, 4 GiB) holds years of silences and a notification
# log (kilobytes each); Azure bills a disk by its tier, so asking for less saves nothing.
ALERTMANAGER_VOLUME_GIB = 4
# An estimate: one Alertmanager routing a cluster's few dozen alert groups uses tens of MiB.
ALERTMANAGER_REQUESTS = {"cpu": "50m", "memory": "64Mi"}
ALERTMANAGER_LIMITS = {"memory": "256Mi"}
# The most characters a secret may hold (the program checks each before it writes the Secret): far
# above any real one (a PagerDuty Events API v2 integration key is 32 characters), so a pasted file or
# a wrong value is refused rather than written into the pod's file.
ALERTING_SECRET_MAX = 1024
