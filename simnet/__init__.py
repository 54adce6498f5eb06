"""simnet: many real nodes in one process, on a virtual clock, over a modeled network.

Public API (import from the modules; this package init imports nothing):
- `simnet.scenario`: `Scenario` and its parts, `load_scenario(path)`, `parse_scenario(dict)`.
- `simnet.runs`: `run_scenario(scenario_or_path, out_dir, progress)`.
- `simnet.engine`: `Simulation` (one run: `probe`, `run`, `summary`); `simnet.sim_nodes`:
  `Progress`, `TimedLearner`.
- `simnet.report`: `write_report(dir)`, `load_runs`, `table_rows`, `control_rows`;
  `simnet.stats`: `paired_ratio_interval` (paired ratios with a 95% t-interval).
- `simnet.network`: `LinkModel`, `SimNetwork`, `mesh_topology`; `simnet.clock`:
  `Scheduler`, `VirtualClock`, `Process`, `run_now`; `simnet.stub`: `StubLearner` (rules
  `count` and `competence`).

Invariant: nothing in node/, gossip/, policy/, rewards/ or swarm/ imports simnet.
"""
