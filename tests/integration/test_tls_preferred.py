"""Connections without TLS options: encrypted when the server offers TLS, as PyMySQL's
"preferred" mode does, with a context that verifies nothing and so loads no CA store (loading it
cost every process ~26 ms on its first connection, db.preferred_tls_context)."""

from __future__ import annotations

import ssl

from jobqueue.core.db import create_engine, preferred_tls_context
from testkit.tls import self_signed_certificate


def test_the_preferred_context_verifies_nothing_and_loads_no_ca_store():
    context = preferred_tls_context()
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
    assert preferred_tls_context() is context  # one per process


def test_a_server_offering_tls_gets_an_encrypted_connection(throwaway_server, db_server, tmp_path):
    if db_server == "mariadb":
        cert, key = self_signed_certificate(tmp_path / "tls")
        server = throwaway_server(f"--ssl-cert={cert}", f"--ssl-key={key}")
    else:
        server = throwaway_server()  # MySQL 8+ and MariaDB 11.4+ make a certificate of their own
    engine = create_engine(server.create_database("jq"), pool_size=1)
    try:
        with engine.connect() as conn:
            cipher = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").one()[1]
        assert cipher, "the connection is not encrypted"
    finally:
        engine.dispose()


# MariaDB 10.11 offers no TLS unless given a certificate; the others must be told not to.
NO_TLS = {"mariadb": (), "mysql": ("--tls-version=",), "mariadb11": ("--skip-ssl",)}


def test_a_server_without_tls_still_connects(throwaway_server, db_server):
    server = throwaway_server(*NO_TLS[db_server])
    engine = create_engine(server.create_database("jq"), pool_size=1)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").one()[1] == ""
    finally:
        engine.dispose()
