"""The queue itself: schema, repository (every SQL statement), worker, reaper, tasks, CLI.

Nothing in this package imports Flask.
"""
