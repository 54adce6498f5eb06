"""The log of a broker outage for `gossip.mqtt.MqttTransport`: what the user sees.

Invariants: one WARNING per distinct cause per outage (at most `MAX_CAUSES_LOGGED`), a
reminder every `OUTAGE_REPORT_S` while it lasts, one INFO line when connected again
(with the outage's length, attempts and dropped publishes); DEBUG for every other
attempt, never a line per attempt or per dropped publish at a level users see. Lines go
to the `gossip.mqtt` logger.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("gossip.mqtt")

OUTAGE_REPORT_S = 300.0
"""While the broker stays unreachable, one reminder WARNING per this many seconds."""
MAX_CAUSES_LOGGED = 8


class Outage:
    """The log of one broker outage: one WARNING per distinct cause, a reminder every
    `OUTAGE_REPORT_S`, one INFO line when it ends; DEBUG for every other attempt."""

    def __init__(self, broker: str, backoff_max_s: float) -> None:
        self.broker = broker
        self.backoff_max_s = backoff_max_s
        self.started: float | None = None
        self.attempts = 0
        self.dropped_before = 0
        self.causes: set[str] = set()
        self.reported = 0.0

    def failed(self, cause: str, delay: float, dropped: int) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started, self.reported, self.dropped_before = now, now, dropped
        self.attempts += 1
        if cause not in self.causes and len(self.causes) < MAX_CAUSES_LOGGED:
            self.causes.add(cause)
            log.warning(
                "MQTT broker %s unavailable: %s; reconnecting with backoff up to %.0f s, "
                "publishes are dropped and counted meanwhile",
                self.broker,
                cause,
                self.backoff_max_s,
            )
        elif now - self.reported >= OUTAGE_REPORT_S:
            self.reported = now
            log.warning(
                "MQTT broker %s still unavailable after %.0f s (%d attempts, %d publishes "
                "dropped); still retrying",
                self.broker,
                now - self.started,
                self.attempts,
                dropped - self.dropped_before,
            )
        else:
            log.debug(
                "MQTT broker %s: attempt failed (%s); next in ~%.1f s", self.broker, cause, delay
            )

    def ended(self, dropped: int, topics: int) -> None:
        if self.started is None:
            log.info("connected to MQTT broker %s", self.broker)
            return
        log.info(
            "reconnected to MQTT broker %s after %.1f s (%d failed attempts, %d publishes "
            "dropped meanwhile, %d topics re-subscribed)",
            self.broker,
            time.monotonic() - self.started,
            self.attempts,
            dropped - self.dropped_before,
            topics,
        )
        self.started = None
        self.attempts = 0
        self.causes.clear()
