"""MQTT over TLS with a password or a client certificate, against a real mosquitto.

One broker per module, two TLS listeners on 127.0.0.1 made from a CA generated here:
`password` (`password_file`, `allow_anonymous false`) and `client_cert`
(`require_certificate true`, the certificate's CN is the user name). Checked: the right
CA and password exchange messages; a wrong password, a wrong CA and a missing client
certificate are counted outages (cause token, one WARNING naming what to check, dropped
publishes counted as `disconnected`), never a crash or a line per attempt; the config
refuses unusable TLS and credential settings with the field and the fix.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from gossip.mqtt import MqttTransport
from gossip.mqtt_connect import warn_if_password_in_clear
from node.ports import free_port
from swarm.config.network import MqttTransportConfig
from swarm.errors import ConfigError
from swarm.identity import Identity
from tests.gossip.conftest import mosquitto_path, terminate

PASSWORD = "correct horse battery staple"
TIMEOUT_S = 10.0


# ---- certificates and the broker ----------------------------------------------------


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, passphrase: bytes = b"") -> None:
    encryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    *,
    server: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer if issuer is not None else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(folder: Path) -> None:
    """ca.pem, other_ca.pem (signed nothing here), server.pem/key, client.pem/key."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("swarm test CA", ca_key)
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    other_key = ec.generate_private_key(ec.SECP256R1())
    (folder / "other_ca.pem").write_bytes(_certificate("other CA", other_key).public_bytes(pem))
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"swarm-{name}", key, (ca.subject, ca_key), server=server)
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(pem))
        _write_key(folder / f"{name}.key", key)


@dataclass
class TlsBroker:
    folder: Path
    password_port: int
    client_cert_port: int
    host: str = "127.0.0.1"

    def config(self, port: int | None = None, **fields: Any) -> MqttTransportConfig:
        tls = {"enabled": True, "ca_file": self.folder / "ca.pem"} | fields.pop("tls", {})
        return MqttTransportConfig(
            host=self.host, port=port or self.password_port, tls=tls, **fields
        )


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    binary, passwd = mosquitto_path(), shutil.which("mosquitto_passwd")
    if binary is None or passwd is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto; CI installs it)")
    folder = tmp_path_factory.mktemp("mqtt_tls")
    make_pki(folder)
    subprocess.run([passwd, "-b", "-c", str(folder / "passwd"), "alice", PASSWORD], check=True)
    broker = TlsBroker(folder, free_port(), free_port())
    tls = f"cafile {folder}/ca.pem\ncertfile {folder}/server.pem\nkeyfile {folder}/server.key\n"
    (folder / "mosquitto.conf").write_text(
        # As root, mosquitto would switch to user `mosquitto`, who cannot read tmp_path.
        f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
        "per_listener_settings true\npersistence false\n"
        f"listener {broker.password_port} 127.0.0.1\n{tls}"
        f"allow_anonymous false\npassword_file {folder}/passwd\n"
        f"listener {broker.client_cert_port} 127.0.0.1\n{tls}"
        "require_certificate true\nuse_identity_as_username true\nallow_anonymous false\n"
    )
    log_path = folder / "mosquitto.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "-c", str(folder / "mosquitto.conf")], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while log_path.read_text().count("Opening ipv4 listen socket") < 2:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        yield broker
    finally:
        terminate(proc)


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "mqtt_password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


async def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def assert_counted_outage(
    transport: MqttTransport, cause: str, caplog: pytest.LogCaptureFixture, says: str
) -> None:
    """Several failed attempts of `cause`, one WARNING saying `says`, publishes counted."""
    await transport.start(wait_connected_s=None)
    try:
        await wait_for(lambda: transport.connect_failures[cause] >= 3, f"3 x {cause}")
        assert not transport.connected
        await transport.publish("swarm/x/rollouts", b"lost")
        stats = transport.stats()
        assert stats["dropped_outgoing_by_reason"]["disconnected"] == 1
        assert stats["connect_failures_by_cause"][cause] >= 3
        assert (
            sum(stats["connect_failures_by_cause"].values())
            == stats["connect_failures_by_cause"][cause]
        )
    finally:
        await transport.stop()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert says in warnings[0].getMessage() and warnings[0].name == "gossip.mqtt"


# ---- against the broker -------------------------------------------------------------


def test_tls_with_password_file_and_env_exchange_messages(
    tls_broker: TlsBroker, password_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARM_TEST_MQTT_PASSWORD", PASSWORD)
    from_file = tls_broker.config(username="alice", password_file=password_file)
    from_env = tls_broker.config(username="alice", password_env="SWARM_TEST_MQTT_PASSWORD")

    async def main() -> None:
        reader = MqttTransport(from_file, Identity.generate())
        sender = MqttTransport(from_env, Identity.generate())
        await reader.start()
        await sender.start()
        try:
            await reader.subscribe("swarm/x/rollouts")
            await sender.publish("swarm/x/rollouts", b"over tls")
            message = await asyncio.wait_for(reader.receive(), TIMEOUT_S)
            assert message.data == b"over tls"
            # `published` counts PUBACKs, which come in the background.
            deadline = time.monotonic() + TIMEOUT_S
            while sender.published < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for transport in (reader, sender):
                stats = transport.stats()
                assert stats["connected"] and stats["published"] + stats["received"] == 1
                assert not any(stats["connect_failures_by_cause"].values())
        finally:
            await sender.stop()
            await reader.stop()

    asyncio.run(main())


def test_wrong_password_is_a_counted_outage_logged_once(
    tls_broker: TlsBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password")
    wrong.chmod(0o600)
    config = tls_broker.config(username="alice", password_file=wrong)
    caplog.set_level(logging.INFO)

    async def main() -> None:
        transport = MqttTransport(config, Identity.generate())
        await assert_counted_outage(transport, "auth_refused", caplog, "refused our credentials")
        caplog.clear()
        # At start, a broker that refuses our credentials is a configuration error
        # naming what to check (later it is an outage, retried: above).
        with pytest.raises(ConfigError, match=r"refused our credentials.*transport\.username"):
            await MqttTransport(config, Identity.generate()).start(wait_connected_s=0.5)

    asyncio.run(main())


def test_no_credentials_at_all_are_refused(
    tls_broker: TlsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    transport = MqttTransport(tls_broker.config(), Identity.generate())
    asyncio.run(
        assert_counted_outage(transport, "auth_refused", caplog, "check transport.username")
    )


def test_wrong_ca_is_a_counted_tls_failure(
    tls_broker: TlsBroker, password_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = tls_broker.config(
        username="alice",
        password_file=password_file,
        tls={"ca_file": tls_broker.folder / "other_ca.pem"},
    )
    transport = MqttTransport(config, Identity.generate())
    asyncio.run(assert_counted_outage(transport, "tls_failed", caplog, "CERTIFICATE_VERIFY_FAILED"))


def test_client_certificate_listener_accepts_the_certificate_only(
    tls_broker: TlsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    folder, port = tls_broker.folder, tls_broker.client_cert_port
    with_cert = tls_broker.config(
        port, tls={"cert_file": folder / "client.pem", "key_file": folder / "client.key"}
    )

    async def main() -> None:
        transport = MqttTransport(with_cert, Identity.generate())
        await transport.start(wait_connected_s=TIMEOUT_S)
        assert transport.connected
        await transport.stop()
        caplog.clear()
        # Without one the broker ends the handshake with an alert; the attempt fails at
        # once with that reason (not after the 10 s connect timeout).
        without = MqttTransport(tls_broker.config(port), Identity.generate())
        t0 = time.monotonic()
        await assert_counted_outage(without, "tls_failed", caplog, "requires a client certificate")
        assert time.monotonic() - t0 < 8.0

    asyncio.run(main())
    # paho's per-attempt error lines stayed at DEBUG.
    assert not [r for r in caplog.records if r.name == "mqtt" and r.levelno >= logging.WARNING]


def test_plain_client_on_a_tls_port_fails_fast_and_says_so(
    tls_broker: TlsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = MqttTransportConfig(host=tls_broker.host, port=tls_broker.password_port)
    transport = MqttTransport(config, Identity.generate())
    asyncio.run(
        assert_counted_outage(transport, "closed_before_connack", caplog, "a TLS listener?")
    )


def test_tls_client_on_a_plain_port_says_so(
    mosquitto_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = MqttTransportConfig(
        host=mosquitto_broker.host, port=mosquitto_broker.port, tls={"enabled": True}
    )
    transport = MqttTransport(config, Identity.generate())
    asyncio.run(assert_counted_outage(transport, "tls_failed", caplog, "its TLS listener"))


# ---- config and credentials (no broker) ---------------------------------------------


def _error(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        MqttTransportConfig(**fields)
    return str(info.value)


def test_config_refuses_unusable_tls_and_credentials(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("x")
    missing = tmp_path / "missing.pem"
    message = _error(tls={"enabled": True, "ca_file": missing})
    assert "tls.ca_file" in message and "missing.pem" in message and "not a file" in message
    message = _error(tls={"enabled": True, "cert_file": pem})
    assert "cert_file is set without key_file" in message
    message = _error(tls={"enabled": True, "key_file": pem})
    assert "key_file is set without cert_file" in message
    message = _error(tls={"ca_file": pem})
    assert "enabled = false" in message and "set enabled = true" in message
    message = _error(username="a", password_file=pem, password_env="X")
    assert "both set" in message
    assert "without username" in _error(password_env="X")
    assert "password_env" in _error(username="a", password_env="not a name")
    assert "password_file" in _error(username="a", password_file=missing)
    assert "Extra inputs" in _error(username="a", password="inline")  # never in the config
    assert MqttTransportConfig(username="a").tls.enabled is False  # user name alone is fine


def test_credentials_that_do_not_load_raise_config_error_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    make_pki(tmp_path)
    identity = Identity.generate()
    monkeypatch.delenv("SWARM_TEST_UNSET", raising=False)
    unset = MqttTransportConfig(username="a", password_env="SWARM_TEST_UNSET")
    with pytest.raises(ConfigError, match="password_env: environment variable SWARM_TEST_UNSET"):
        MqttTransport(unset, identity)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"password_file: .* is empty"):
        MqttTransport(MqttTransportConfig(username="a", password_file=empty), identity)
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"tls\.ca_file: cannot load"):
        MqttTransport(MqttTransportConfig(tls={"enabled": True, "ca_file": not_pem}), identity)
    mismatched = {"enabled": True, "cert_file": tmp_path / "client.pem", "key_file": not_pem}
    with pytest.raises(ConfigError, match="cert_file / key_file"):
        MqttTransport(MqttTransportConfig(tls=mismatched), identity)
    _write_key(tmp_path / "locked.key", ec.generate_private_key(ec.SECP256R1()), b"secret")
    locked = mismatched | {"key_file": tmp_path / "locked.key"}
    with pytest.raises(ConfigError, match="key_file is encrypted"):
        MqttTransport(MqttTransportConfig(tls=locked), identity)

    readable = tmp_path / "readable"
    readable.write_text("pw\n")
    readable.chmod(0o644)
    caplog.set_level(logging.WARNING)
    transport = MqttTransport(MqttTransportConfig(username="a", password_file=readable), identity)
    assert transport._credentials.password == "pw"
    assert "pw" not in repr(transport._credentials)
    assert "readable by other users" in caplog.text


def test_password_without_tls_to_a_remote_host_warns(
    password_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for host, tls, warns in [
        ("198.51.100.7", False, True),
        ("broker.example.org", False, True),
        ("127.0.0.1", False, False),
        ("localhost", False, False),
        ("198.51.100.7", True, False),
    ]:
        caplog.clear()
        config = MqttTransportConfig(
            host=host, username="alice", password_file=password_file, tls={"enabled": tls}
        )
        transport = MqttTransport(config, Identity.generate())
        warn_if_password_in_clear(config, transport._credentials)
        assert ("WITHOUT TLS" in caplog.text) == warns, (host, tls)
        assert PASSWORD not in caplog.text
