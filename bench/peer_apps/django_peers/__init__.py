"""A small Django 6 project for the MySQL peers of bench/mysql_peers.py: dj-queue and
django-tasks-db (Django's tasks framework) and django-q2 (its ORM broker). $BENCH_PEER picks the
one installed (settings.py), $BENCH_DB_* the fresh database of the run. Runs in the peers' venv
(bench/peers_venv.py), never in ours."""
