"""The start-up check of aiomqtt's and paho's internals (`gossip.mqtt_selfcheck`, issue
34): it passes on the pinned versions, and a missing hook, a hook no longer registered, a
missing connection future or a changed paho log path stops an MQTT transport's start
with an error naming the library, its version and the pin."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pytest

from gossip.mqtt import MqttTransport
from gossip.mqtt_selfcheck import AIOMQTT_PIN, PAHO_PIN, check_mqtt_internals
from swarm.config.network import MqttTransportConfig
from swarm.identity import Identity
from swarm.internals import LibraryInternalsChanged


def _check_in_a_loop() -> None:
    async def main() -> None:
        check_mqtt_internals()

    asyncio.run(main())


def _names(exc: pytest.ExceptionInfo[LibraryInternalsChanged], lib: str, pin: str) -> str:
    text = str(exc.value)
    assert f"{lib} {version(lib)} (installed)" in text
    assert f"pyproject.toml pins {pin}" in text
    return text


def test_the_installed_versions_pass() -> None:
    check_mqtt_internals()  # without a loop: the class-level checks
    _check_in_a_loop()  # with one: the client's futures too


def test_a_missing_hook_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(aiomqtt.Client, "_on_socket_register_write")
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_mqtt_internals()
    text = _names(exc, "aiomqtt", AIOMQTT_PIN)
    assert "Client._on_socket_register_write is missing (used by gossip/mqtt_connect.py)" in text


def test_a_hook_no_longer_registered_and_a_missing_future_fail_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = aiomqtt.Client.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:  # a version that renamed both
        original(self, *args, **kwargs)
        del self._disconnected

    monkeypatch.setattr(aiomqtt.Client, "__init__", init)
    with pytest.raises(LibraryInternalsChanged) as exc:
        _check_in_a_loop()
    text = _names(exc, "aiomqtt", AIOMQTT_PIN)
    assert "Client.__init__ no longer uses _on_disconnect" in text
    assert "Client instance._disconnected is missing" in text


def test_a_changed_paho_log_path_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    def easy_log(self: Any, level: Any, fmt: str, *args: Any) -> None:
        self._logger.error(fmt, *args)

    monkeypatch.setattr(paho.Client, "_easy_log", easy_log)
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_mqtt_internals()
    assert "Client._easy_log no longer uses log" in _names(exc, "paho-mqtt", PAHO_PIN)


def test_the_transport_does_not_start_on_changed_internals(
    monkeypatch: pytest.MonkeyPatch, free_tcp_port: int
) -> None:
    monkeypatch.delattr(aiomqtt.Client, "_on_disconnect")
    transport = MqttTransport(MqttTransportConfig(port=free_tcp_port), Identity.generate())

    async def start() -> None:
        try:
            await transport.start(wait_connected_s=None)
        finally:
            await transport.stop()

    with pytest.raises(LibraryInternalsChanged, match="_on_disconnect is missing"):
        asyncio.run(start())
