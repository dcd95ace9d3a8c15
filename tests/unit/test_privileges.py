"""Reading SHOW GRANTS FOR CURRENT_USER() (jobqueue.core.privileges) on answers recorded from MySQL
8.0 and MariaDB 10.11: which privileges read_only does not bind, and what the account may do with
the queue's tables."""

from __future__ import annotations

from jobqueue.core.preflight import QUEUE_TABLES
from jobqueue.core.privileges import DML, Grant, parse_grant, parse_grants

# MySQL 8.0.3x, root@localhost after a default install (GRANT ALL ON *.* is spelled out there:
# static privileges on one line, dynamic ones on another, without spaces after the commas).
MYSQL_ROOT = [
    "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, RELOAD, SHUTDOWN, PROCESS, FILE, REFERENCES, INDEX, ALTER, "
    "SHOW DATABASES, SUPER, CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, REPLICATION SLAVE, REPLICATION CLIENT, "
    "CREATE VIEW, SHOW VIEW, CREATE ROUTINE, ALTER ROUTINE, CREATE USER, EVENT, TRIGGER, CREATE TABLESPACE, "
    "CREATE ROLE, DROP ROLE ON *.* TO `root`@`localhost` WITH GRANT OPTION",
    "GRANT APPLICATION_PASSWORD_ADMIN,AUDIT_ABORT_EXEMPT,AUDIT_ADMIN,AUTHENTICATION_POLICY_ADMIN,BACKUP_ADMIN,"
    "BINLOG_ADMIN,BINLOG_ENCRYPTION_ADMIN,CLONE_ADMIN,CONNECTION_ADMIN,ENCRYPTION_KEY_ADMIN,FIREWALL_EXEMPT,"
    "FLUSH_OPTIMIZER_COSTS,FLUSH_STATUS,FLUSH_TABLES,FLUSH_USER_RESOURCES,GROUP_REPLICATION_ADMIN,"
    "GROUP_REPLICATION_STREAM,INNODB_REDO_LOG_ARCHIVE,INNODB_REDO_LOG_ENABLE,PASSWORDLESS_USER_ADMIN,"
    "PERSIST_RO_VARIABLES_ADMIN,REPLICATION_APPLIER,REPLICATION_SLAVE_ADMIN,RESOURCE_GROUP_ADMIN,RESOURCE_GROUP_USER,"
    "ROLE_ADMIN,SENSITIVE_VARIABLES_OBSERVER,SERVICE_CONNECTION_ADMIN,SESSION_VARIABLES_ADMIN,SET_USER_ID,SHOW_ROUTINE,"
    "SYSTEM_USER,SYSTEM_VARIABLES_ADMIN,TABLE_ENCRYPTION_ADMIN,TELEMETRY_LOG_ADMIN,XA_RECOVER_ADMIN ON *.* TO "
    "`root`@`localhost` WITH GRANT OPTION",
    "GRANT PROXY ON ''@'' TO 'root'@'localhost' WITH GRANT OPTION",
]
# MySQL 8.0: the account docs/deploy.md recommends, one with CONNECTION_ADMIN on top, one whose
# privileges come through a role, and one with ALL on its database (DDL included, no SUPER).
MYSQL_APP = [
    "GRANT USAGE ON *.* TO `jobqueue`@`%`",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON `jobqueue`.* TO `jobqueue`@`%`",
]
MYSQL_CONNECTION_ADMIN = [
    "GRANT USAGE ON *.* TO `jobqueue`@`%`",
    "GRANT CONNECTION_ADMIN ON *.* TO `jobqueue`@`%`",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON `jobqueue`.* TO `jobqueue`@`%`",
]
MYSQL_ROLE = ["GRANT USAGE ON *.* TO `jobqueue`@`%`", "GRANT `queue_rw`@`%` TO `jobqueue`@`%`"]
MYSQL_ALL_ON_DB = [
    "GRANT USAGE ON *.* TO `ml_app`@`localhost`",
    "GRANT ALL PRIVILEGES ON `ml_app`.* TO `ml_app`@`localhost`",
]
MYSQL_PATTERN = [
    "GRANT USAGE ON *.* TO `jq`@`10.0.%`",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON `jq\\_prod\\_%`.* TO `jq`@`10.0.%`",
]
MYSQL_TABLES = (
    ["GRANT USAGE ON *.* TO `jq`@`%`"]
    + [f"GRANT SELECT, INSERT, UPDATE, DELETE ON `jq`.`{t}` TO `jq`@`%`" for t in QUEUE_TABLES if t != "audit_log"]
    + ["GRANT SELECT (`id`, `at`), INSERT ON `jq`.`audit_log` TO `jq`@`%`"]
)

# MariaDB 10.11.
MARIADB_ROOT = [
    "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` IDENTIFIED VIA mysql_native_password USING "
    "'invalid' OR unix_socket WITH GRANT OPTION",
    "GRANT PROXY ON ''@'%' TO 'root'@'localhost' WITH GRANT OPTION",
]
MARIADB_APP = [
    "GRANT USAGE ON *.* TO `jq`@`127.0.0.1` IDENTIFIED BY PASSWORD '*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19'",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON `jq`.* TO `jq`@`127.0.0.1`",
]
MARIADB_READ_ONLY_ADMIN = [
    "GRANT READ_ONLY ADMIN ON *.* TO `jq`@`127.0.0.1`",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON `jq`.* TO `jq`@`127.0.0.1`",
]
MARIADB_SUPER = [
    "GRANT SUPER ON *.* TO `jq`@`127.0.0.1`",
    "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP ON `jq`.* TO `jq`@`127.0.0.1`",
]


def test_mysql_root_holds_super_and_connection_admin():
    grants = parse_grants(MYSQL_ROOT)
    assert grants.read_only_exempt("mysql") == ["SUPER", "CONNECTION_ADMIN"]
    assert grants.roles == () and len(grants.grants) == 2


def test_mysql_least_privilege_accounts():
    app = parse_grants(MYSQL_APP)
    assert app.read_only_exempt("mysql") == []
    assert all(set(DML) <= held for held in app.on_tables("jobqueue", QUEUE_TABLES).values())
    assert all(not held for held in app.on_tables("other", QUEUE_TABLES).values())
    assert parse_grants(MYSQL_CONNECTION_ADMIN).read_only_exempt("mysql") == ["CONNECTION_ADMIN"]
    # MariaDB's CONNECTION ADMIN is not exempt from read_only there.
    assert parse_grants(["GRANT CONNECTION ADMIN ON *.* TO `jq`@`%`"]).read_only_exempt("mariadb") == []


def test_mysql_roles_database_patterns_table_and_column_grants():
    role = parse_grants(MYSQL_ROLE)
    assert role.roles == ("`queue_rw`@`%`",)
    assert all(not held for held in role.on_tables("jobqueue", QUEUE_TABLES).values())
    all_on_db = parse_grants(MYSQL_ALL_ON_DB)
    assert all_on_db.read_only_exempt("mysql") == []  # ALL on one database is not ALL on *.*
    assert {"CREATE", "DROP", "SELECT"} <= all_on_db.on_tables("ml_app", ["job_queue"])["job_queue"]
    pattern = parse_grants(MYSQL_PATTERN)
    assert set(DML) <= pattern.on_tables("jq_prod_eu", ["job_queue"])["job_queue"]
    assert not pattern.on_tables("jqXprod_eu", ["job_queue"])["job_queue"]  # "\_" is a literal underscore
    tables = parse_grants(MYSQL_TABLES).on_tables("jq", QUEUE_TABLES)
    assert set(DML) <= tables["job_queue"] and tables["audit_log"] == {"INSERT"}  # SELECT on two columns only


def test_mariadb_forms():
    assert parse_grants(MARIADB_ROOT).read_only_exempt("mariadb") == ["ALL PRIVILEGES"]
    app = parse_grants(MARIADB_APP)
    assert app.read_only_exempt("mariadb") == [] and set(DML) <= app.on_tables("jq", ["job_queue"])["job_queue"]
    assert parse_grants(MARIADB_READ_ONLY_ADMIN).read_only_exempt("mariadb") == ["READ_ONLY ADMIN"]
    assert parse_grants(MARIADB_SUPER).read_only_exempt("mariadb") == ["SUPER"]


def test_odd_lines():
    assert parse_grant("GRANT ALL ON *.* TO `x`@`%`") == Grant(frozenset({"ALL PRIVILEGES"}), None, None, frozenset())
    assert parse_grant("GRANT EXECUTE ON PROCEDURE `jq`.`p` TO `x`@`%`").database == "jq"
    assert parse_grant("REVOKE INSERT ON `mysql`.* FROM `x`@`%`") is None
    assert parse_grant("GRANT SELECT ON `odd``name ON x`.* TO `x`@`%`").database == "odd`name ON x"
    assert parse_grant("GRANT SELECT ON `to db`.`t` TO `x`@`%`").table == "t"
