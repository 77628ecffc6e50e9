"""`rlhfless repro`: regenerate the paper's figures from this machine's real runs and from the simulator.

`studies.STUDIES` names every study (a figure or a small set of them); `cli` runs the chosen ones into one
folder and `report` writes `report.md` (every figure, the command and config hash behind it, and a table with the
paper's number, ours and why they differ) plus `results.json`. Each study is also a W&B run (offline by default)
grouped by study, with its figures, table and inputs as artifacts.
"""
