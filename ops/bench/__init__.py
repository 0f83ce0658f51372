"""`python -m ops.bench`: the in-process pipeline and the gateway end to end, side by side.

Modules: `pipeline` (in process), `endtoend` (closed-loop HTTP load, `Server-Timing`),
`target` (local app or URL, forcing an arm through the audited path, the order of the cells),
`cells` (the end-to-end part, cell by cell), `workload` (the texts: mixed or short), `cpu`
(CPU per request of each process on a cell's path), `plain` (a plain Ray Serve deployment of
the same model, for `--plain`), `anchor` (gateway ÷ plain per cell), `peers` (peer servers of
the same model, for `--peer`, and gateway ÷ the fastest of them), `report` (derived figures,
JSON / markdown / PNG), `__main__` (the command).
"""
