"""TLS for the connections setl opens to SQL servers: a source's `ssl` config as PyMySQL's
`ssl.SSLContext` or as libpq's ``sslmode`` parameters, the check that a PyMySQL session really is
encrypted, and the one-phrase cause of a TLS failure (docs/tls.md).

`verify: true` checks the server's certificate chain (against `ca`, or the system's trusted CAs
when `ca` is not given) and that the certificate names the host setl connects to; `verify: false`
encrypts without checking who answers. With `ssl` a server that offers no TLS is refused. Without
`ssl` the drivers' default holds (PyMySQL's PREFERRED, libpq's ``sslmode=prefer``): encrypted when
the server offers TLS, never verified, clear text otherwise.
"""

from __future__ import annotations

import re
import ssl
from typing import TYPE_CHECKING, Any

from setl.adapters import pymysql as pymysql_io
from setl.errors import ConfigError

if TYPE_CHECKING:
    from setl.config import SslConfig


def mysql_context(config: SslConfig, *, where: str = "ssl", pipeline: str | None = None) -> ssl.SSLContext:
    """The context PyMySQL (and the binlog stream) wraps its socket in; a ConfigError naming
    `where` if a certificate or key cannot be loaded."""
    try:
        context = ssl.create_default_context(cafile=config.ca)
        # MySQL's and MariaDB's self-made certificates lack extensions the strict mode of Python
        # 3.13 requires; PyMySQL clears the flag for the same reason.
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        if config.verify:
            context.check_hostname = True
            context.verify_mode = ssl.CERT_REQUIRED
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if config.cert:
            context.load_cert_chain(config.cert, keyfile=config.key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot load the TLS files: {exc}", pipeline=pipeline) from exc
    return context


def server_context(cert: str, key: str, *, where: str = "http.tls") -> ssl.SSLContext:
    """The context the node's HTTP endpoint serves HTTPS with (TLS 1.2 at least); a ConfigError
    naming `where` if the certificate or key cannot be loaded."""
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, keyfile=key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot load the TLS files: {exc}") from exc
    return context


def libpq_params(config: SslConfig | None) -> dict[str, Any]:
    """libpq's connection parameters for `config`: ``sslmode`` verify-full (verify: true) or
    require (verify: false), and the files; none without `ssl` (libpq's default, or PGSSLMODE)."""
    if config is None:
        return {}
    params: dict[str, Any] = {"sslmode": "verify-full" if config.verify else "require"}
    if config.verify:  # without verification `ca` is left out: libpq would verify the chain (verify-ca)
        params["sslrootcert"] = config.ca or "system"
    if config.cert:
        params["sslcert"] = config.cert
    if config.key:
        params["sslkey"] = config.key
    return params


def encrypted(conn: Any) -> bool:
    """Whether a PyMySQL connection's socket is a TLS one."""
    return isinstance(pymysql_io.socket_of(conn), ssl.SSLSocket)


class NotEncrypted(ConnectionError):
    """`ssl` is configured but the server offered no TLS: PyMySQL would go on in clear text."""


def require_encrypted(conn: Any, host: str, port: int) -> None:
    """Close `conn` and raise NotEncrypted unless its session is encrypted."""
    if encrypted(conn):
        return
    try:
        conn.close()
    finally:
        raise NotEncrypted(f"{host}:{port} does not offer TLS (its ssl_cert and ssl_key are not set), "
                           "and ssl is configured: setl does not fall back to clear text")


# What libpq says of a TLS failure (psycopg gives them as OperationalError without a SQLSTATE).
_LIBPQ_TLS = re.compile(
    r"certificate verify failed|does not match host name|server does not support SSL|root certificate file"
    r"|certificate present, but not private key|could not load private key|private key file .* has"
    r"|could not read certificate|could not load certificate|alert unknown ca|alert bad certificate"
    r"|certificate required|sslrootcert|requires a valid client certificate|certificate authentication failed",
    re.IGNORECASE)
_CR_SSL_CONNECTION_ERROR = 2026  # PyMySQL: TLS required (ssl given) but the server offers none
# OpenSSL reasons (ssl.SSLError.reason) that come out the same on every attempt.
_PERMANENT_REASONS = frozenset({
    "CERTIFICATE_VERIFY_FAILED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
    "TLSV1_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE",
    "TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE",
    "TLSV1_ALERT_ACCESS_DENIED", "TLSV1_ALERT_DECRYPT_ERROR",
})


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = (current.__cause__ or current.__context__
                   or getattr(current, "original_exception", None))
    return seen


def tls_failure(error: BaseException) -> str | None:
    """The cause of a TLS failure retrying cannot fix (a certificate not trusted, a host name it
    does not name, a client certificate refused, a server without TLS), in one phrase; None for
    any other error, a TLS connection merely dropped included."""
    for exc in _chain(error):
        if isinstance(exc, ssl.SSLCertVerificationError):
            detail = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc
            return f"the server's certificate is not trusted (certificate verify failed: {detail})"
        if isinstance(exc, NotEncrypted):
            return str(exc)
        if type(exc).__module__.startswith("pymysql") and exc.args and exc.args[0] == _CR_SSL_CONNECTION_ERROR:
            return f"{exc.args[-1]} (is ssl_cert set on the server?)"
        if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _PERMANENT_REASONS:
            return f"the TLS handshake failed: {exc.reason}"
        if type(exc).__module__.startswith("psycopg") and not getattr(exc, "sqlstate", None):
            text = str(exc).strip().splitlines()
            found = next((line.strip() for line in text if _LIBPQ_TLS.search(line)), None)
            if found is not None:
                return "libpq: " + re.sub(r"^.*?port \d+ failed:\s*", "", found)
    return None


__all__ = ["NotEncrypted", "encrypted", "libpq_params", "mysql_context", "require_encrypted", "tls_failure"]
