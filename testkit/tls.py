"""A throwaway self-signed certificate for HTTPS tests (gunicorn serving TLS itself)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed_certificate(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) in PEM files under `folder`, valid for `host` for one day."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    san = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "1",
            "-subj",
            f"/CN={host}",
            "-addext",
            f"subjectAltName={san}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
