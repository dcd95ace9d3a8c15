"""The scale-out and failover drill (issue 15): `python -m drill.run`, see drill/run.py."""
