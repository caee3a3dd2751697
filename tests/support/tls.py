"""A self-signed certificate for localhost, for the TLS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(where: Path) -> tuple[Path, Path]:
    """(key, certificate) of a fresh self-signed certificate for 127.0.0.1,
    made with openssl."""
    key, cert = where / "key.pem", where / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert
