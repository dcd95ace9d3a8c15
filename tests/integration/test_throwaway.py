"""The throwaway server itself: restarts keep the port and the data, so tests (and a soak test
that restarts the server under running workers) can rely on it."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db

pytestmark = pytest.mark.slow


def test_stop_kill_and_start_keep_port_and_data(throwaway_server):
    server = throwaway_server()
    port = server.port
    url = server.create_database("jq")
    engine = create_engine(url, pool_size=1)
    try:
        init_db(engine)
        with engine.connect() as conn:
            service.enqueue(conn, "noop", "kept")

        server.stop()
        assert not server.running
        with pytest.raises(OperationalError):
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        server.start()
        assert server.port == port
        server.kill()  # a crash: InnoDB recovers the committed job
        server.start()
        assert server.port == port
        with engine.connect() as conn:  # the engine from before the restarts reconnects
            assert repository.stats.count_by_status(conn) == [("default", "ready", 1)]
    finally:
        engine.dispose()

    server.restart("--read-only")
    assert server.variable("read_only") == "ON" and server.port == port
