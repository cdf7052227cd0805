"""What the commands print and the assets draw, from what the graph wrote under a data root: the
funnel report (funnel.py), one document's trail through the funnel (trail.py), the curriculum
contract's tables and schedule plot (contract.py), and what the drop policy removed from a phase
(exclusions.py). Commands (refinery/commands/) and assets import these; assets never import a
command module (tests/test_architecture.py)."""
