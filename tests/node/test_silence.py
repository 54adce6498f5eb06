"""SilenceWatch: a warning when connected to peers and hearing nothing, at most once per
REPEAT_S while it lasts, anew after any message; nothing when alone or hearing."""

from __future__ import annotations

from node.silence import REPEAT_S, SILENT_AFTER_S, SilenceWatch, real_connections


def test_connected_and_silent_warns_once_per_repeat_and_anew_after_a_message() -> None:
    watch = SilenceWatch()
    assert watch.observe(0.0, 1, 0) is None
    assert watch.observe(SILENT_AFTER_S - 1, 1, 0) is None
    warning = watch.observe(SILENT_AFTER_S, 1, 0)
    assert warning is not None and "another node running with this node's key" in warning
    assert "for 30 s" in warning and "1 peer(s)" in warning
    assert "Are they stopped" in warning  # a frozen peer keeps its connection open
    assert watch.observe(SILENT_AFTER_S + 5, 1, 0) is None  # said once
    assert watch.observe(SILENT_AFTER_S + REPEAT_S, 1, 0) is not None  # and again later
    # A message ends the silence; a new one is timed from scratch.
    assert watch.observe(1000.0, 1, 1) is None
    assert watch.observe(1000.0 + SILENT_AFTER_S - 1, 1, 1) is None
    assert watch.observe(1001.0 + SILENT_AFTER_S, 2, 1) is not None


def test_no_warning_when_hearing_or_alone() -> None:
    hearing = SilenceWatch()
    for t in range(0, 200, 5):
        assert hearing.observe(float(t), 3, t) is None  # a message every 5 s
    alone = SilenceWatch()
    for t in range(0, 200, 5):
        assert alone.observe(float(t), 0, 0) is None  # no connection: alone, not deaf


def test_only_real_connections_count() -> None:
    class Libp2pLike:
        def peer_links(self) -> dict[str, str]:
            return {"a": "direct", "b": "relayed"}

    class BrokerLike:
        def connected_peers(self) -> list[str]:
            return ["mqtt://broker:1883"]

    assert real_connections(Libp2pLike()) == 2
    assert real_connections(BrokerLike()) == 0
