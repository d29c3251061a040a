"""Where TLS material lands on each role.

Renderers reference these paths in flags; the Pulumi program (which creates the
certificates, issue 3) delivers files to exactly these paths. The trust layout:

- each etcd cluster (main, events) has its own CA; members' server and peer certificates
  are signed by it, and `--peer-trusted-ca-file` is that CA alone, so a member of one
  cluster can never join the other;
- kube-apiserver has one etcd client certificate (one `--etcd-certfile` serves both
  `--etcd-servers` and `--etcd-servers-overrides`), signed by the main etcd CA; each
  cluster's `--trusted-ca-file` (ETCD_CLIENT_CA) therefore holds the main etcd CA (plus,
  for the events cluster, its own CA for local etcdctl);
- kube-apiserver's `--etcd-cafile` is a bundle of both etcd CAs.
"""

ETCD_PKI_DIR = "/etc/etcd/pki"
ETCD_CA = f"{ETCD_PKI_DIR}/ca.crt"
ETCD_CLIENT_CA = f"{ETCD_PKI_DIR}/client-ca.crt"
ETCD_SERVER_CERT = f"{ETCD_PKI_DIR}/server.crt"
ETCD_SERVER_KEY = f"{ETCD_PKI_DIR}/server.key"
ETCD_PEER_CERT = f"{ETCD_PKI_DIR}/peer.crt"
ETCD_PEER_KEY = f"{ETCD_PKI_DIR}/peer.key"

K8S_PKI_DIR = "/etc/kubernetes/pki"
K8S_CA = f"{K8S_PKI_DIR}/ca.crt"
K8S_CA_KEY = f"{K8S_PKI_DIR}/ca.key"
APISERVER_CERT = f"{K8S_PKI_DIR}/apiserver.crt"
APISERVER_KEY = f"{K8S_PKI_DIR}/apiserver.key"
APISERVER_ETCD_CA_BUNDLE = f"{K8S_PKI_DIR}/etcd-ca-bundle.crt"
APISERVER_ETCD_CLIENT_CERT = f"{K8S_PKI_DIR}/apiserver-etcd-client.crt"
APISERVER_ETCD_CLIENT_KEY = f"{K8S_PKI_DIR}/apiserver-etcd-client.key"
APISERVER_KUBELET_CLIENT_CERT = f"{K8S_PKI_DIR}/apiserver-kubelet-client.crt"
APISERVER_KUBELET_CLIENT_KEY = f"{K8S_PKI_DIR}/apiserver-kubelet-client.key"
SERVICE_ACCOUNT_KEY = f"{K8S_PKI_DIR}/sa.key"
SERVICE_ACCOUNT_PUB = f"{K8S_PKI_DIR}/sa.pub"
