"""gossip: moving signed envelopes between peers over a pluggable `Transport`.

Invariants:
- No torch, no model code, and no import of node/policy/rewards/simnet.
- Importing `gossip` does not import a networking library: the libp2p and MQTT
  transports live in `gossip.libp2p` / `gossip.mqtt` and are imported explicitly.
- `Gossip` (gossip.layer) is the only way payloads enter or leave a node; everything it
  returns is authenticated, deduplicated, rate-limited and within configured bounds.
"""

from gossip.layer import Gossip, Received
from gossip.memory import MemoryNetwork, MemoryTransport, get_network

__all__ = ["Gossip", "MemoryNetwork", "MemoryTransport", "Received", "get_network"]
