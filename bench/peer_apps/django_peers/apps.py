from django.apps import AppConfig


class DjangoPeersConfig(AppConfig):
    name = "bench.peer_apps.django_peers"
    label = "django_peers"

    def ready(self) -> None:
        # The start gate (bench/gate.py): a worker command waits here, after Django and the
        # peer are imported and set up, until every process of the run is ready. No-op without
        # $BENCH_GATE_DIR (migrate, the enqueue script, a forked or spawned child after "go").
        from bench.gate import wait

        wait()
