"""swarm: the shared core of a decentralized RL post-training node.

Invariant: this package imports no other package of this project, no torch and no
networking library. Everything here is pure data, codecs, identities and rules that
every other package (and every peer on the wire) agrees on.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 5
