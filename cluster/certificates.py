"""The local control plane's PKI, made fresh at every `cluster up`.

One CA signs the API server's serving certificate (for 127.0.0.1, the node's address, the
`kubernetes` Service's address and the names a client may use), the kubelet's serving
certificate and the API server's client certificate there (for `kubectl logs` and `exec`),
the admin's client certificate (organisation `system:masters`, which the RBAC authorizer
lets do anything, as kubeadm's admin.conf does), and one client certificate per component
with the identity Kubernetes' default RBAC bindings and the Node authorizer expect
(`system:node:NAME` in `system:nodes`, `system:kube-proxy`, `system:kube-scheduler`,
`system:kube-controller-manager`), so each runs with no more than its own role. The service-account
signing key pair is separate, as kube-apiserver wants it. Everything is written under
one directory with owner-only permissions; nothing is reused between clusters.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
ADMIN_USER = "kubeinfer-admin"
ADMIN_GROUP = "system:masters"
NODE_NAME = "kubeinfer-node"
COMPONENTS = {
    "node": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", None),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kube-controller-manager": ("system:kube-controller-manager", None),
}
"""Each component's client identity (user, group), as its default RBAC binding names it."""
SERVING_ADDRESSES = ("127.0.0.1", "10.244.0.1", "10.96.0.1")
"""Loopback, the node's address (the API server's advertised one) and the `kubernetes`
Service's (what pods connect to)."""


@dataclass(frozen=True)
class Pki:
    """Paths of the files `write_pki` made."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def kubelet_cert(self) -> Path:
        return self.directory / "kubelet.crt"

    @property
    def kubelet_key(self) -> Path:
        return self.directory / "kubelet.key"

    @property
    def kubelet_client_cert(self) -> Path:
        return self.directory / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.directory / "apiserver-kubelet-client.key"

    def component_cert(self, component: str) -> Path:
        return self.directory / f"{component}.crt"

    def component_key(self, component: str) -> Path:
        return self.directory / f"{component}.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(parts)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    *,
    ca: bool = False,
    usage: list[x509.ObjectIdentifier] | None = None,
    alt_names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clock skew between processes
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _serving_names() -> list[x509.GeneralName]:
    """The names and addresses a client may reach the API server (or the node's kubelet)
    by: every one must be in the certificate, or TLS verification fails."""
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", NODE_NAME]  # fmt: skip
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in SERVING_ADDRESSES]
    return alt


def _leaves(
    pki: Pki, alt: list[x509.GeneralName]
) -> list[tuple[Path, Path, x509.Name, x509.ObjectIdentifier, list[x509.GeneralName] | None]]:
    """Every certificate the CA signs: key path, certificate path, subject, extended key
    usage, alternative names."""
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    return [
        (pki.serving_key, pki.serving_cert, _name("kube-apiserver"), server, alt),
        (pki.admin_key, pki.admin_cert, _name(ADMIN_USER, ADMIN_GROUP), client, None),
        # The node's kubelet endpoint (pod logs, exec), the API server's client identity
        # there, and each component's identity at the API server.
        (pki.kubelet_key, pki.kubelet_cert, _name("kubeinfer-node"), server, alt),
        (
            pki.kubelet_client_key,
            pki.kubelet_client_cert,
            _name("kube-apiserver-kubelet-client", ADMIN_GROUP),
            client,
            None,
        ),
        *(
            (pki.component_key(c), pki.component_cert(c), _name(user, group), client, None)
            for c, (user, group) in COMPONENTS.items()
        ),
    ]


def write_pki(directory: Path, now: datetime.datetime | None = None) -> Pki:
    """Makes the CA, the serving and admin certificates and the service-account keys."""
    now = now or datetime.datetime.now(datetime.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = Pki(directory)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kubeinfer-local-ca")
    ca = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, now, ca=True)
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    for key_path, cert_path, subject, usage, alt_names in _leaves(pki, _serving_names()):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(
            subject, key.public_key(), ca_name, ca_key, now, usage=[usage], alt_names=alt_names
        )
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    # RSA, as service-account tokens are RS256 by default everywhere that verifies them.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
