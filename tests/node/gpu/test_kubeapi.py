"""The agent's and controller's kubeconfig reading (yaml.safe_load, as on the node): the kubelet's own
file after TLS bootstrap (client-go's YAML, certificate paths) and the controller's (written
by kilonode.azure.tls with PyYAML, base64 -data fields), a real certificate and key loading
into the TLS context, and clear errors naming the file and field."""

from __future__ import annotations

import base64
import datetime
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kilonode.node.gpu.kubeapi import Client, KubeconfigError, load_kubeconfig
from kilonode.node.ship import GPU_HEALTH


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a client certificate signed by it, as a kubelet's is (cryptography, the
    library kilonode's Pulumi program signs with)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str, org: str | None = None) -> x509.Name:
        parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []
        return x509.Name([*parts, x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("kubernetes")).issuer_name(name("kubernetes"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    client = (x509.CertificateBuilder().subject_name(name("system:node:nc-a100-000001", "system:nodes"))
              .issuer_name(ca.subject).public_key(client_key.public_key()).serial_number(2)
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
              .sign(ca_key, hashes.SHA256()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "client.crt").write_bytes(client.public_bytes(serialization.Encoding.PEM))
    (d / "client.key").write_bytes(pem(client_key))
    (d / "current.pem").write_bytes((d / "client.crt").read_bytes() + (d / "client.key").read_bytes())
    return {name: d / name for name in ("ca.crt", "client.crt", "client.key", "current.pem")}


def kubelet_kubeconfig(pki: dict[str, Path]) -> str:
    # the layout the kubelet writes after TLS bootstrap (client-go clientcmd, certificate
    # rotation: one PEM with certificate and key, kubelet-client-current.pem)
    ca = base64.b64encode(pki["ca.crt"].read_bytes()).decode()
    return f"""apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://10.0.0.4:6443
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {{}}
users:
- name: default-auth
  user:
    client-certificate: {pki["current.pem"]}
    client-key: {pki["current.pem"]}
"""


def test_the_kubelets_kubeconfig_is_read_and_its_certificate_loads(tmp_path: Path, pki: dict[str, Path]) -> None:
    path = tmp_path / "kubelet.kubeconfig"
    path.write_text(kubelet_kubeconfig(pki))
    config = load_kubeconfig(path)
    assert config.server == "https://10.0.0.4:6443"
    assert config.ca_pem == pki["ca.crt"].read_bytes()
    assert config.cert_pem == config.key_pem == pki["current.pem"].read_bytes()
    client = Client(config)
    assert (client.host, client.port) == ("10.0.0.4", 6443)
    assert client.context.verify_mode == ssl.CERT_REQUIRED and client.context.check_hostname


def test_the_controllers_kubeconfig_as_kilonode_writes_it(tmp_path: Path, pki: dict[str, Path]) -> None:
    def b64(name: str) -> str:
        return base64.b64encode(pki[name].read_bytes()).decode()

    # kilonode.azure.tls.kubeconfig's document, serialised the same way (yaml.safe_dump)
    text = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kilonode", "cluster": {"server": "https://127.0.0.1:6443",
                                                      "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "component", "user": {"client-certificate-data": b64("client.crt"),
                                                 "client-key-data": b64("client.key")}}],
        "contexts": [{"name": "kilonode", "context": {"cluster": "kilonode", "user": "component"}}],
        "current-context": "kilonode",
    }, sort_keys=False)
    path = tmp_path / "gpu-health-controller.kubeconfig"
    path.write_text(text)
    config = load_kubeconfig(path)
    assert config.server == "https://127.0.0.1:6443" and config.key_pem == pki["client.key"].read_bytes()
    Client(config)


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.replace("current-context: default-context\n", ""), "no current-context"),
    (lambda t: t.replace("user: default-auth\n  name: default-context", "user: nobody\n  name: default-context"),
     "no user named 'nobody' in `users`"),
    (lambda t: t.replace("https://10.0.0.4:6443", "http://10.0.0.4:8080"), "has no https:// server"),
    (lambda t: t.replace("    client-key: ", "    token: "), "needs client-certificate(-data) and client-key"),
    (lambda t: t.replace("certificate-authority-data: ", "certificate-authority-data: x"),
     "certificate-authority-data is not base64"),
    # an unclosed flow mapping: PyYAML finds it on the next line
    (lambda t: t.replace("preferences: {}", "preferences: {colors: true"), ":16: not YAML"),
])
def test_a_bad_kubeconfig_names_the_file_and_field(tmp_path: Path, pki: dict[str, Path],
                                                   change: Callable[[str], str], message: str) -> None:
    path = tmp_path / "kubelet.kubeconfig"
    path.write_text(change(kubelet_kubeconfig(pki)))
    with pytest.raises(KubeconfigError, match=f"^{path}") as error:
        load_kubeconfig(path)
    assert message in str(error.value)


def test_a_key_that_does_not_match_is_refused_clearly(tmp_path: Path, pki: dict[str, Path]) -> None:
    path = tmp_path / "kubelet.kubeconfig"
    text = kubelet_kubeconfig(pki).replace(f"client-key: {pki['current.pem']}", f"client-key: {pki['ca.crt']}")
    path.write_text(text)
    with pytest.raises(KubeconfigError, match="the client certificate and key do not load"):
        Client(load_kubeconfig(path))


def test_the_whole_package_imports_with_debians_python_and_the_standard_library_alone(tmp_path: Path) -> None:
    from tests.node.gpu.nodes import DEBIAN_PYTHON, run_debian

    modules = sorted(p.stem for p in GPU_HEALTH.path.glob("*.py") if p.stem != "__init__")
    assert {"active", "agent", "controller", "kubeapi", "protocol", "readings", "rules"} <= set(modules)
    run_debian(tmp_path, "kilonode.gpu")  # copies the package (a package is not runnable: exit 1)
    result = subprocess.run(
        [DEBIAN_PYTHON, "-S", "-c", "import sys; " + "; ".join(f"import kilonode.gpu.{m}" for m in modules)
         + "; print(sorted(m for m in sys.modules if m.startswith(('numpy', 'yaml', 'pydantic'))))"],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PYTHONPATH": str(tmp_path / "python"), "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr
