"""How `gossip.mqtt.MqttTransport` connects: TLS, credentials, why an attempt failed, and
the aiomqtt client's plumbing (subscription options, incoming queue, disconnect wait).

Invariants:
- Credentials are resolved once, when the transport is built (`broker_credentials`):
  the password comes from `password_file` (its first line) or the environment variable
  `password_env`, never from the config file itself. Anything unusable (an empty or
  unreadable password file, an unset variable, a certificate or key that does not
  load, an encrypted key) raises `ConfigError` naming the field and the fix, before
  any connection is tried. The password never appears in a log line or a repr.
- TLS always verifies the broker: certificate chain against `tls.ca_file` (or the
  system's CAs) and the host name against `transport.host`. There is no option to
  turn verification off.
- A password sent without TLS to a broker that is not on loopback logs one WARNING per
  `start` (`warn_if_password_in_clear`).
- Every failed connection attempt gets a stable cause token (`CONNECT_FAILURE_CAUSES`,
  counted by the transport) and one plain sentence naming what to check
  (`describe_failure`); the text is stable across attempts, so the transport's outage
  log prints it once per outage.
- `BrokerClient` fails a connection attempt as soon as the broker closes the socket
  before its CONNACK (e.g. a TLS alert for a missing client certificate, or a plain
  client on a TLS port), with paho's reason, instead of waiting out the connect
  timeout; paho's own per-attempt error lines go to DEBUG, never to the user's log.
- `BrokerClient` registers paho's socket for writing only if it is still open when the
  event loop gets to it: a broker that drops the connection meanwhile is a lost
  connection, not an error inside the event loop (aiomqtt's own registration then
  logged a "Bad file descriptor" traceback into the node's log).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from swarm.config.network import MqttTransportConfig
from swarm.errors import ConfigError

__all__ = [
    "CONNECT_FAILURE_CAUSES",
    "MISCONFIGURED_CAUSES",
    "BrokerClient",
    "BrokerCredentials",
    "ClosedBeforeConnack",
    "broker_credentials",
    "describe_failure",
    "inbox_queue_type",
    "subscribe_options",
    "wait_disconnected",
    "warn_if_password_in_clear",
]

log = logging.getLogger("gossip.mqtt")

CONNECT_FAILURE_CAUSES = (
    "auth_refused",
    "refused",
    "tls_failed",
    "closed_before_connack",
    "timeout",
    "unreachable",
    "connection_lost",
)
"""Why a connection attempt failed, or why a connection ended (`connection_lost`)."""
MISCONFIGURED_CAUSES = frozenset({"auth_refused", "tls_failed", "closed_before_connack"})
"""Failures that a broker which answered puts down to our configuration (credentials,
TLS, a plain port used for TLS or the other way round), not to its being away."""
_AUTH_REASON_CODES = frozenset({4, 5, 134, 135})
"""CONNACK codes for bad credentials: MQTT 3.1.1 (4, 5) and v5 (134, 135)."""


@dataclass(frozen=True)
class BrokerCredentials:
    """What the transport hands to every `BrokerClient` it makes."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_context: ssl.SSLContext | None = None


def broker_credentials(config: MqttTransportConfig) -> BrokerCredentials:
    """Resolve the password and build the TLS context; `ConfigError` names the field."""
    return BrokerCredentials(config.username, _password(config), _tls_context(config))


def _password(config: MqttTransportConfig) -> str | None:
    if config.password_env is not None:
        value = os.environ.get(config.password_env)
        if not value:
            raise ConfigError(
                f"transport.password_env: environment variable {config.password_env} is "
                "unset or empty: export it before starting the node"
            )
        return value
    if config.password_file is None:
        return None
    path = config.password_file.expanduser()
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"transport.password_file: cannot read {path}: {exc}") from None
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise ConfigError(
            f"transport.password_file: {path} is empty: write the password on its first line"
        )
    if mode & 0o077:
        log.warning("transport.password_file %s is readable by other users: chmod 600 it", path)
    return lines[0]


def _refuse_key_password() -> str:
    raise ConfigError(
        "transport.tls.key_file is encrypted: give an unencrypted PEM key (mode 0600)"
    )


def _tls_context(config: MqttTransportConfig) -> ssl.SSLContext | None:
    tls = config.tls
    if not tls.enabled:
        return None
    ca = str(tls.ca_file.expanduser()) if tls.ca_file is not None else None
    try:
        context = ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"transport.tls.ca_file: cannot load CA certificates from {ca}: {exc}"
        ) from None
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(
                str(tls.cert_file.expanduser()),
                str(tls.key_file.expanduser()),
                password=_refuse_key_password,
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"transport.tls.cert_file / key_file: cannot load the client certificate "
                f"{tls.cert_file} with key {tls.key_file} (does the key match?): {exc}"
            ) from None
    return context


def _is_loopback_host(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_password_in_clear(config: MqttTransportConfig, credentials: BrokerCredentials) -> None:
    if (
        credentials.password is not None
        and credentials.tls_context is None
        and not _is_loopback_host(config.host)
    ):
        log.warning(
            "sending the MQTT password for user %r to %s:%d WITHOUT TLS: anyone on the path "
            "can read it; set transport.tls.enabled = true (and the broker's TLS port)",
            config.username,
            config.host,
            config.port,
        )


class ClosedBeforeConnack(aiomqtt.MqttError):
    """The broker closed the connection before accepting it (no CONNACK came)."""


def describe_failure(exc: BaseException, *, connected: bool, tls: bool) -> tuple[str, str]:
    """(cause token, one sentence naming what to check) for a failed attempt.

    `connected`: the broker had accepted this connection before it ended; `tls`: the
    attempt used TLS.
    """
    if connected:
        return "connection_lost", f"connection lost ({type(exc).__name__}: {exc})"
    if isinstance(exc, MqttConnectError):
        code = exc.rc.value if isinstance(exc.rc, ReasonCode) else exc.rc
        if code in _AUTH_REASON_CODES:
            return "auth_refused", (
                f"the broker refused our credentials ({exc}): check transport.username and "
                "its password (transport.password_file or password_env), or the client "
                "certificate it expects"
            )
        return "refused", f"the broker refused the connection ({exc})"
    text = str(exc)
    if _is_tls_error(exc) or "SSL" in text:
        return "tls_failed", f"TLS failed: {_tls_hint(text)} ({text})"
    if isinstance(exc, ClosedBeforeConnack):
        hint = "see the broker's log" if tls else "is this port a TLS listener? (tls.enabled)"
        return "closed_before_connack", f"{text}: {hint}"
    if tls and _caused_by(exc, ConnectionResetError):
        # A plain MQTT listener drops a TLS ClientHello as a malformed packet.
        return "tls_failed", (
            f"TLS failed: the broker reset the connection during the handshake: is this "
            f"port its TLS listener (often 8883)? ({text})"
        )
    if isinstance(exc, TimeoutError) or "timed out" in text:
        return "timeout", f"no answer to CONNECT within the timeout ({text})"
    return "unreachable", f"{type(exc).__name__}: {text}"


def _tls_hint(text: str) -> str:
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            "the broker's certificate was not accepted: check transport.tls.ca_file (the CA "
            "that signed it) and that the certificate names transport.host"
        )
    if "CERTIFICATE_REQUIRED" in text or "certificate required" in text:
        return (
            "the broker requires a client certificate: set transport.tls.cert_file and "
            "key_file (signed by a CA the broker trusts)"
        )
    if "WRONG_VERSION_NUMBER" in text or "record layer" in text:
        return "the broker does not speak TLS on this port: use its TLS port (often 8883)"
    return (
        "check transport.tls.ca_file, transport.host against the broker's certificate, "
        "the port (the broker's TLS listener) and the client certificate if it needs one"
    )


def _is_tls_error(exc: BaseException) -> bool:
    return _caused_by(exc, ssl.SSLError, ssl.CertificateError)


def _caused_by(exc: BaseException, *types: type[BaseException]) -> bool:
    """aiomqtt re-raises socket errors as `MqttError(str(exc)) from None`: the original
    is still the exception's `__context__`."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, types):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _PahoLog(logging.Logger):
    """paho's logger for one client: what paho logs at ERROR or above is kept as
    `last_error` (the reason for a closed connection) and, like everything else paho
    logs, goes to DEBUG. aiomqtt's own warnings (`.warning`, `.exception`) pass
    through unchanged: only paho calls `log`."""

    def __init__(self) -> None:
        super().__init__("gossip.mqtt.paho")
        self.parent = log
        self.last_error = ""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level >= logging.ERROR:
            try:
                self.last_error = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):  # a malformed format: keep it unformatted
                self.last_error = f"{msg} {args}"
        # `log` (registered) answers: this unregistered logger's level cache is never reset.
        if log.isEnabledFor(logging.DEBUG):
            self._log(logging.DEBUG, msg, args, **kwargs)


class BrokerClient(aiomqtt.Client):
    """`aiomqtt.Client` that fails a connection attempt as soon as the broker closes it
    before a CONNACK (aiomqtt 2.5 ignores that disconnection and waits for the timeout).

    It overrides aiomqtt's `_on_disconnect` and `_on_socket_register_write` and sets its
    `_connected` and `_disconnected` futures (aiomqtt is pinned to 2.5): each reach is
    checked when the transport starts (`gossip.mqtt_selfcheck`, naming the version and
    the pin), `tests/gossip/test_mqtt_tls.py` fails if the first stops working (the
    missing-client-certificate attempt would then wait out the timeout), and
    `tests/gossip/test_mqtt_register_write.py` if the write registration does. Made in
    the event loop it runs in (as aiomqtt requires), whose handle it keeps itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.paho_log = _PahoLog()
        self.event_loop = asyncio.get_running_loop()
        super().__init__(*args, logger=self.paho_log, **kwargs)

    def _on_disconnect(
        self,
        client: Any,
        userdata: Any,
        flags: Any,
        reason_code: ReasonCode,
        properties: Any = None,
    ) -> None:
        connecting = self._connected
        if not connecting.done():
            detail = self.paho_log.last_error or str(reason_code)
            error = ClosedBeforeConnack(
                f"the broker closed the connection before accepting it ({detail})"
            )
            # paho may call this from the executor thread that runs connect().
            self.event_loop.call_soon_threadsafe(_fail_pending, connecting, error)
        super()._on_disconnect(client, userdata, flags, reason_code, properties)


    def _on_socket_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        # aiomqtt schedules `add_writer(fd)` from paho's thread; by the time the loop runs
        # it the socket may be closed (the fd then fails, or names another socket).
        fd = sock.fileno()

        def write() -> None:
            try:
                client.loop_write()
            except OSError as exc:  # a broken pipe, a reset, a TLS failure
                self._lose_connection(exc)

        def register() -> None:
            if sock.fileno() != fd:
                return  # closed meanwhile: the reader side reports the lost connection
            try:
                self.event_loop.add_writer(fd, write)
            except OSError as exc:
                self._lose_connection(exc)

        self.event_loop.call_soon_threadsafe(register)

    def _lose_connection(self, exc: OSError) -> None:
        if not self._disconnected.done():
            self._disconnected.set_exception(exc)


def _fail_pending(future: Any, error: BaseException) -> None:
    if not future.done():  # not already answered, nor cancelled by the connect timeout
        future.set_exception(error)


async def wait_disconnected(client: aiomqtt.Client) -> None:
    """Wait until the broker connection drops, then raise `MqttError`.

    aiomqtt's message iterator also ends on disconnection; its queue never holds a
    message here (`inbox_queue_type`), so it yields nothing.
    """
    async for _ in client.messages:
        raise RuntimeError("aiomqtt queued a message; the inbox queue type was bypassed")


def inbox_queue_type(
    on_message: Callable[[aiomqtt.Message], None],
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """aiomqtt's incoming-queue class: hands every message to `on_message`, keeps none."""

    class InboxQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            on_message(item)

    return InboxQueue


def subscribe_options(qos: int) -> SubscribeOptions:
    """Our subscriptions: at `qos`, and never our own publishes back (MQTT v5 No Local)."""
    return SubscribeOptions(qos=qos, noLocal=True)
