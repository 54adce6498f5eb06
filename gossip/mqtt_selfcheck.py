"""Every aiomqtt and paho-mqtt internal that `gossip.mqtt_connect` reaches into, checked
when an MQTT transport starts (`check_mqtt_internals`, before the first connection).

Invariant: each private hook `BrokerClient` overrides, each private attribute it reads and
each library behaviour it relies on is listed here. On a version whose internals moved,
`MqttTransport.start` raises `swarm.internals.LibraryInternalsChanged` naming the library,
its installed version, its pin (`AIOMQTT_PIN`, `PAHO_PIN`, as in pyproject.toml) and every
missing piece, instead of a client whose overrides are never called (a connection the
broker closed before its CONNACK would then wait out the connect timeout, and a write
registration on a closed socket would log a traceback again).

What is reached:
- aiomqtt `Client._on_disconnect` and `Client._on_socket_register_write`: overridden; the
  constructor must still register them with paho (by name).
- aiomqtt `Client._connected` and `Client._disconnected`: the futures a connection attempt
  and a connection wait on; set and failed by `BrokerClient`.
- aiomqtt hands each received message to its queue's `put_nowait` (`inbox_queue_type`).
- paho `Client._easy_log` hands its log lines to the configured logger's `log` (how
  `BrokerClient` learns why paho closed a connection).
"""

from __future__ import annotations

import asyncio

import aiomqtt
import paho.mqtt.client as paho

from swarm.internals import Reaches

AIOMQTT_PIN = "aiomqtt>=2.5.1,<2.6"
PAHO_PIN = "paho-mqtt>=2.1,<2.3"
_USER = "gossip/mqtt_connect.py"


def check_aiomqtt(r: Reaches) -> None:
    client = aiomqtt.Client
    r.attr(client, "_on_disconnect", _USER,
           params=("client", "userdata", "flags", "reason_code", "properties"))  # fmt: skip
    r.attr(client, "_on_socket_register_write", _USER, params=("client", "userdata", "sock"))
    r.calls(client, "__init__",
            ("_on_disconnect", "_on_socket_register_write", "_connected", "_disconnected"),
            _USER)  # fmt: skip
    r.calls(client, "__aenter__", ("_connected", "_disconnected"), _USER)
    r.calls(client, "_on_message", ("put_nowait",), _USER)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # the instance checks need the loop a client is made in
    try:
        sample = aiomqtt.Client("127.0.0.1")
    except Exception as exc:  # noqa: BLE001 - any failure is the change reported
        r.problem(f"aiomqtt.Client(host) fails: {exc!r}", _USER)
        return
    r.attr(sample, "_connected", _USER, kind=asyncio.Future)
    r.attr(sample, "_disconnected", _USER, kind=asyncio.Future)


def check_paho(r: Reaches) -> None:
    r.calls(paho.Client, "_easy_log", ("_logger", "log"), _USER)
    r.attr(paho.Client, "loop_write", _USER)


def check_mqtt_internals() -> None:
    """Raise `LibraryInternalsChanged` unless aiomqtt and paho still have every internal
    listed in the module docstring (call in the event loop the clients will run in)."""
    aiomqtt_reaches = Reaches("aiomqtt", ("aiomqtt",), AIOMQTT_PIN)
    check_aiomqtt(aiomqtt_reaches)
    aiomqtt_reaches.raise_if_missing()
    paho_reaches = Reaches("paho-mqtt", ("paho-mqtt",), PAHO_PIN)
    check_paho(paho_reaches)
    paho_reaches.raise_if_missing()
