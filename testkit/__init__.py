"""Test helpers shared by the test suite, the soak and the benchmarks: throwaway MariaDB servers,
a primary with GTID replicas made of them (replication), hosts in network namespaces (netns),
real worker and gunicorn processes, the tasks they run, and the test users and tokens.

A package of the project (installed with it), so everything imports it by name; nothing patches
`sys.path`.
"""
