"""SQL the tests write that both MariaDB and MySQL accept."""

from __future__ import annotations


def seq_rows(n: int) -> str:
    """The end of an `INSERT ... SELECT ... FROM {seq_rows(n)}`: a derived table of one column
    `seq` holding 1..n, in order, so that AUTO_INCREMENT ids follow seq. MariaDB's seq_1_to_N
    tables (its Sequence engine) do not exist on MySQL: this is a cross join of digit rows, which
    MySQL returns in another order unless told (id 8000 got seq 7091)."""
    digits = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"
    places = max(1, len(str(max(n - 1, 0))))
    value = " + ".join(f"d{i}.d * {10**i}" for i in range(places))
    joined = " CROSS JOIN ".join(f"{digits} AS d{i}" for i in range(places))
    return f"(SELECT 1 + {value} AS seq FROM {joined} WHERE 1 + {value} <= {n}) AS seq_rows ORDER BY seq"


def rows_read(conn) -> int:
    """Index entries and table rows read so far: MariaDB's Rows_read (this session's; temporary
    tables not counted). MySQL has no such session counter, and its Handler_read_* count the
    temporary tables of a UNION or a derived table too, so there it is the server's
    Innodb_rows_read: every session's, which is this test's alone while tests share a server one at
    a time (scripts/test gives each server one pytest process)."""
    row = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Rows_read'").first()
    if row is not None:
        return int(row[1])
    return int(conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Innodb_rows_read'").one()[1])


def explain(conn, statement: str) -> list:
    """EXPLAIN's rows, one per table read, with the traditional columns (`key`, `type`, `Extra`,
    ...): MySQL 8.0.32+ may answer a bare EXPLAIN as TREE or JSON (`explain_format`; TREE by
    default on 9.x), so it is asked for the table; MariaDB has no FORMAT=TRADITIONAL."""
    prefix = "EXPLAIN " if getattr(conn.dialect, "is_mariadb", False) else "EXPLAIN FORMAT=TRADITIONAL "
    return list(conn.exec_driver_sql(prefix + statement).mappings())


def statements_sent(engine, run, wanted=lambda statement: True) -> list[str]:
    """The statements `run()` sent on `engine` that `wanted(statement)` keeps, as the server got
    them (parameters filled in by the driver)."""
    import sqlalchemy as sa

    sent: list[str] = []

    def grab(c, cursor, statement, params, context, executemany):
        if wanted(statement):
            sent.append(cursor.mogrify(statement, params))

    sa.event.listen(engine, "before_cursor_execute", grab)
    try:
        run()
    finally:
        sa.event.remove(engine, "before_cursor_execute", grab)
    return sent
