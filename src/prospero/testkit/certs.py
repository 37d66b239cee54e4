"""Throw-away TLS material for tests and the demo (caliband-wire.md §1.3).

`make_certs()` builds a private CA and a server certificate signed by it whose SAN covers
`localhost`, `127.0.0.1` and `caliband` (the server name Prospero verifies by default). The
server chain (`cert_pem`) is leaf + CA; clients trust `ca_pem`. `make_self_signed()` builds a
single self-signed certificate that serves as its own trust anchor, the way upstream tests do.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "caliband")


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes. `cert_pem` is the server chain, `key_pem` its key, `ca_pem` the trust anchor."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    def write(self, directory: str | Path, prefix: str = "caliband") -> CertFiles:
        """Write `<prefix>.crt`, `<prefix>.key` (mode 0600) and `<prefix>-ca.crt`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = CertFiles(d / f"{prefix}.crt", d / f"{prefix}.key", d / f"{prefix}-ca.crt")
        files.cert.write_bytes(self.cert_pem)
        fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.key_pem)
        files.ca.write_bytes(self.ca_pem)
        return files

    def server_context(self) -> ssl.SSLContext:
        return server_ssl_context(self.cert_pem, self.key_pem)


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


def make_certs(
    names: Sequence[str] = DEFAULT_NAMES, *, common_name: str = "caliband", days: int = 30
) -> CertBundle:
    """A private CA plus a server certificate for `names`, signed by it."""
    not_before, not_after = _validity(days)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prospero test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
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
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = _key()
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(srv_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = _pem_cert(ca_cert)
    return CertBundle(
        cert_pem=_pem_cert(srv_cert) + ca_pem, key_pem=_pem_key(srv_key), ca_pem=ca_pem
    )


def make_self_signed(
    names: Sequence[str] = DEFAULT_NAMES, *, common_name: str = "caliband", days: int = 30
) -> CertBundle:
    """One self-signed certificate that is both the server certificate and the trust anchor."""
    not_before, not_after = _validity(days)
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_san(names), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    pem = _pem_cert(cert)
    return CertBundle(cert_pem=pem, key_pem=_pem_key(key), ca_pem=pem)


def server_ssl_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A TLS 1.2+ server context from PEM bytes (no client certificates requested)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    d = tempfile.mkdtemp(prefix="pr-tls-")
    cert_file, key_file = Path(d) / "c.pem", Path(d) / "k.pem"
    try:
        cert_file.write_bytes(cert_pem)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key_pem)
        ctx.load_cert_chain(str(cert_file), str(key_file))
    finally:
        for f in (cert_file, key_file):
            with contextlib.suppress(OSError):
                f.unlink()
        with contextlib.suppress(OSError):
            os.rmdir(d)
    return ctx
