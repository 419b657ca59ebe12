"""TLS for fleets that span hosts: the fleet CA, site certificates, SSL contexts (ARCHITECTURE §10).

Theory of operation. A fleet is its own certificate authority: :func:`create_ca` makes a key and a
self-signed CA certificate once, and :func:`issue_certificate` signs one certificate per site (and
one for the fleet's MQTT broker). A site's certificate names, as subject alternative names, the
host of the site's ``http`` URL (an IP address or a DNS name) and ``localhost``, and it serves for
both ends of a connection (server and client authentication), because peers present it to each
other. Nothing but the fleet CA is trusted between sites: an address in the topology is only
believed when the certificate that answers there was signed by the fleet's key.

:func:`server_context` is what a broker (or the MQTT broker) listens with: its certificate and
key, TLS 1.2 or newer; given the fleet CA as well, a client that presents a certificate must
present one the CA signed, or the handshake fails. Clients without a certificate (users' CLIs)
still get through the handshake: they prove who they are with a token, not here.
:func:`client_context` is what a client or a peer connects with: it verifies the server's chain
against the fleet CA and checks the host name, TLS 1.2 or newer, and presents the site's own
certificate when it has one.

:func:`fleet_certificates` does all of that for a topology in one directory (``gbroker fleet up
--tls``): it keeps an existing CA (so clients that trust it go on trusting it across restarts of
the fleet) and issues fresh site certificates (the hosts may have changed). Private keys are
written 0600 from the start. How a client picks its CA (``--ca``, else ``$GBROKER_CA``, else the
CA of the fleet directory it finds) is :func:`gbroker.client.fleetdir.find_ca`.

Files are PEM. Keys are ECDSA P-256: fast to make, and every TLS 1.2+ stack speaks it.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gbroker.errors import InvalidInput
from gbroker.security.auth import write_private

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CertificateFiles",
    "check_endpoint",
    "client_context",
    "create_ca",
    "daemon_contexts",
    "fleet_certificates",
    "issue_certificate",
    "server_context",
    "url_host",
]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"

_CA_DAYS = 3650
_SITE_DAYS = 825  # the longest validity clients such as browsers still accept
_SERVER_AND_CLIENT = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    """Where one party's certificate, its private key and the fleet CA certificate are."""

    cert: Path
    key: Path
    ca: Path


# --- making certificates -------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    # Back-dated a little: a peer whose clock runs slightly behind accepts a fresh certificate.
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


def create_ca(directory: Path, name: str = "GBroker fleet CA") -> CertificateFiles:
    """Make a fleet CA in ``directory``: ``ca.key`` (0600) and the self-signed ``ca.crt``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = _now()
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    files = CertificateFiles(directory / CA_CERT, directory / CA_KEY, directory / CA_CERT)
    write_private(files.key, _pem_key(key))
    files.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return files


def _read_ca(ca: CertificateFiles) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        certificate = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    except ValueError as exc:
        raise InvalidInput("tls_ca", "a PEM CA certificate", str(ca.cert)) from exc
    try:
        key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidInput("tls_ca key", "an unencrypted PEM private key", str(ca.key)) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidInput("tls_ca key", "an ECDSA private key", str(ca.key))
    return certificate, key


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_certificate(
    ca: CertificateFiles, directory: Path, name: str, hosts: Iterable[str]
) -> CertificateFiles:
    """Sign a certificate for ``name`` valid for ``hosts`` and ``localhost``: ``<name>.crt`` and
    ``<name>.key`` (0600) in ``directory``. It authenticates servers and clients alike."""
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidInput("certificate name", "a file name without '/' or NUL", name)
    names = list(dict.fromkeys([*(h.strip("[]") for h in hosts if h), "localhost"]))
    ca_certificate, ca_key = _read_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    start = _now()
    public = key.public_key()
    ca_ski = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=_SITE_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = CertificateFiles(directory / f"{name}.crt", directory / f"{name}.key", ca.cert)
    write_private(files.key, _pem_key(key))
    files.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return files


def url_host(url: str) -> str:
    """The host of an endpoint URL (``https://10.0.0.5:8701`` -> ``10.0.0.5``)."""
    host = urlsplit(url).hostname
    if not host:
        raise InvalidInput("url", "scheme://host[:port]", url)
    return host


def fleet_certificates(
    directory: Path, endpoints: Mapping[str, Iterable[str]]
) -> dict[str, CertificateFiles]:
    """The fleet CA in ``directory`` (made unless there) and a fresh certificate for each name
    in ``endpoints``, valid for the hosts of its URLs and ``localhost``."""
    ca = CertificateFiles(directory / CA_CERT, directory / CA_KEY, directory / CA_CERT)
    if not (ca.cert.exists() and ca.key.exists()):
        ca = create_ca(directory)
    return {
        name: issue_certificate(ca, directory, name, [url_host(url) for url in urls])
        for name, urls in endpoints.items()
    }


# --- using them -----------------------------------------------------------------------------------


def server_context(cert: Path, key: Path, ca: Path | None = None) -> ssl.SSLContext:
    """Listen with ``cert`` and ``key``, TLS 1.2+. With the fleet ``ca``, a client certificate
    is optional but, when presented, must be one the CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key)
    if ca is not None:
        _load_ca(context, ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """Connect verifying the server against the fleet ``ca`` (the system's CAs when None), host
    name checked, TLS 1.2+; present ``cert`` and ``key`` when given (a peer's own)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(context, ca)
    if cert is not None and key is not None:
        _load_chain(context, cert, key)
    return context


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        field = "tls_key" if exc.filename == str(key) else "tls_cert"
        raise InvalidInput(field, "an existing PEM file", exc.filename) from exc
    except (ssl.SSLError, OSError) as exc:
        raise InvalidInput(
            "tls_cert", f"a PEM certificate with its private key in {key} ({exc})", str(cert)
        ) from exc


def _load_ca(context: ssl.SSLContext, ca: Path) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except FileNotFoundError as exc:
        raise InvalidInput("tls_ca", "an existing PEM CA certificate", str(ca)) from exc
    except (ssl.SSLError, OSError) as exc:
        raise InvalidInput("tls_ca", f"a PEM CA certificate ({exc})", str(ca)) from exc


def daemon_contexts(
    cert: Path | None, key: Path | None, ca: Path | None
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """A broker's (server, client) contexts: HTTPS when it has a certificate and key (both or
    neither); its calls to peers present them and verify against ``ca``. (None, None): plain
    HTTP, with https peers verified against the system's CAs."""
    if (cert is None) != (key is None):
        missing = "tls_key" if key is None else "tls_cert"
        raise InvalidInput(missing, "both a TLS certificate and its key, or neither")
    if cert is None or key is None:
        return None, client_context(ca) if ca is not None else None
    return server_context(cert, key, ca), client_context(ca, cert, key)


def check_endpoint(site: str, url: str | None, serving_tls: bool) -> None:
    """Refuse a broker whose own topology endpoint says otherwise than how it serves: its peers
    would speak plain HTTP to a TLS port, or TLS to a plain one."""
    if url is None:
        return
    scheme = urlsplit(url).scheme
    if serving_tls and scheme != "https":
        raise InvalidInput(f"site[{site}].http", "an https:// endpoint for a TLS broker", url)
    if not serving_tls and scheme == "https":
        raise InvalidInput("tls_cert", f"a certificate and key: site {site} serves at {url}")
