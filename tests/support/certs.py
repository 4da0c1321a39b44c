"""Certificates, keys and Java keystores made by the tests: a CA, broker and client
certificates, PKCS12 (cryptography) and JKS (the JDK's keytool) stores."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID


@dataclass
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def key_pem(self, password: str | None = None) -> str:
        encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                      else serialization.NoEncryption())
        return self.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8, encryption).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str = "kwatermark test CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(key, cert)


def issue(ca: Issued, common_name: str, hosts: tuple[str, ...] = ()) -> Issued:
    """A leaf certificate signed by ``ca``; ``hosts`` (DNS names or IP addresses) become its
    subject alternative names."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name))
               .issuer_name(ca.cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1))
               .not_valid_after(now + dt.timedelta(days=2)))
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def write_pkcs12(path: Path, password: str, leaf: Issued | None = None,
                 trusted: tuple[Issued, ...] = ()) -> Path:
    """A PKCS12 store: ``leaf``'s key and certificate, and/or ``trusted`` certificates."""
    encryption = serialization.BestAvailableEncryption(password.encode())
    data = pkcs12.serialize_key_and_certificates(
        b"client" if leaf else None, leaf.key if leaf else None, leaf.cert if leaf else None,
        [t.cert for t in trusted] or None, encryption)
    path.write_bytes(data)
    return path


def keytool() -> str:
    found = shutil.which("keytool")
    assert found, "keytool (a JDK) is needed to make JKS stores for these tests"
    return found


def write_jks_truststore(path: Path, password: str, ca: Issued) -> Path:
    return write_keytool_truststore(path, password, ca, "JKS")


def write_jks_keystore(path: Path, store_password: str, leaf: Issued, ca: Issued,
                       key_password: str | None = None) -> Path:
    """A JKS keystore with ``leaf``'s key (its own password if given) and chain, converted by
    keytool from a PKCS12 store, as a user would."""
    staging = write_pkcs12(path.with_suffix(".staging.p12"), store_password, leaf, (ca,))
    command = [keytool(), "-importkeystore", "-noprompt", "-srckeystore", str(staging),
               "-srcstoretype", "PKCS12", "-srcstorepass", store_password,
               "-destkeystore", str(path), "-deststoretype", "JKS",
               "-deststorepass", store_password]
    if key_password:
        command += ["-destkeypass", key_password, "-srcalias", "client"]
    subprocess.run(command, check=True, capture_output=True)
    staging.unlink()
    return path


def write_keytool_truststore(path: Path, password: str, ca: Issued,
                             store_type: str = "JKS") -> Path:
    """A truststore made by keytool, as a Java user makes one: JKS, or PKCS12 whose entries
    carry Java's trusted-certificate attribute (which Java needs to trust them)."""
    pem = path.with_suffix(".ca.pem")
    pem.write_text(ca.cert_pem())
    subprocess.run([keytool(), "-importcert", "-noprompt", "-alias", "ca", "-file", str(pem),
                    "-storetype", store_type, "-keystore", str(path), "-storepass", password],
                   check=True, capture_output=True)
    pem.unlink()
    return path
