"""The fuzz harness of `tests/swarm/fuzz_wire.py`, one module per part (see its docstring)."""
