"""What the queue's MySQL account may do, read from `SHOW GRANTS FOR CURRENT_USER()`.

The queue needs SELECT, INSERT, UPDATE and DELETE on its own tables, nothing more; `init-db`
also needs CREATE, ALTER, INDEX and DROP there (better: a separate migration account). Some
privileges are worse than unneeded, because `read_only` does not bind them: an account holding
them writes to a replica that was made read-only to keep writers away, and the queue there
diverges from the primary. Those are SUPER and ALL PRIVILEGES (on both servers), READ_ONLY ADMIN
on MariaDB (10.5.2+) and CONNECTION_ADMIN on MySQL 8.0. `super_read_only` (MySQL) binds them
all, but nothing makes a server set it.

Both servers answer with one `GRANT ... ON ... TO ...` line per privilege level, in slightly
different forms:

    GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION                    (MariaDB)
    GRANT USAGE ON *.* TO `jq`@`%` IDENTIFIED BY PASSWORD '*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19'
    GRANT SELECT, INSERT, UPDATE, DELETE ON `jq`.* TO `jq`@`%`
    GRANT SELECT, ..., SUPER, ... ON *.* TO `root`@`localhost` WITH GRANT OPTION             (MySQL 8.0: ALL spelled out)
    GRANT APPLICATION_PASSWORD_ADMIN,...,CONNECTION_ADMIN,... ON *.* TO `root`@`localhost`   (its dynamic privileges)
    GRANT `app_role`@`%` TO `jq`@`%`                                                        (a role)

Privileges that come through roles are not on these lines; the check says so when there are
roles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
DDL = ("CREATE", "ALTER", "INDEX", "DROP")
# Privileges that let an account write although the server is read_only, by server flavour.
READ_ONLY_EXEMPT = {
    "mariadb": ("SUPER", "ALL PRIVILEGES", "READ_ONLY ADMIN"),
    "mysql": ("SUPER", "ALL PRIVILEGES", "CONNECTION_ADMIN"),
}
# What the Locks page and `explain` read to name who holds a job's row (read-only, optional):
# PROCESS for INNODB_TRX on both, and on MySQL these performance_schema tables too (without
# SELECT on them MySQL answers 1142; no account reads them by default).
PERFORMANCE_SCHEMA_TABLES = ("data_locks", "threads", "events_statements_current")


@dataclass(frozen=True)
class Grant:
    privileges: frozenset[str]  # upper case, single spaces; "ALL" is read as "ALL PRIVILEGES"
    database: str | None  # None: every database (*.*)
    table: str | None  # None: every table of `database`
    columns_only: frozenset[str]  # privileges granted on some columns only

    @property
    def is_global(self) -> bool:
        return self.database is None


@dataclass(frozen=True)
class Grants:
    grants: tuple[Grant, ...]
    roles: tuple[str, ...]  # roles granted to the account, whose privileges are not listed

    def global_privileges(self) -> frozenset[str]:
        return frozenset().union(*(g.privileges for g in self.grants if g.is_global))

    def read_only_exempt(self, flavour: str) -> list[str]:
        held = self.global_privileges()
        return [p for p in READ_ONLY_EXEMPT.get(flavour, READ_ONLY_EXEMPT["mysql"]) if _normal(p) in held]

    def lock_inspection_missing(self, flavour: str) -> list[str]:
        """What the account lacks to read other connections' transactions and row locks."""
        missing = [] if {"PROCESS", "ALL PRIVILEGES"} & self.global_privileges() else ["PROCESS"]
        if flavour == "mysql":
            held = self.on_tables("performance_schema", PERFORMANCE_SCHEMA_TABLES)
            lacking = [t for t in PERFORMANCE_SCHEMA_TABLES if "SELECT" not in held[t]]
            if lacking:
                missing.append("SELECT on " + ", ".join(f"performance_schema.{t}" for t in lacking))
        return missing

    def on_tables(self, database: str, tables: Sequence[str]) -> dict[str, frozenset[str]]:
        """What the account may do with each of `tables` in `database` (whole-table privileges;
        ALL PRIVILEGES counts as every one of them)."""
        out = {}
        for table in tables:
            held: set[str] = set()
            for g in self.grants:
                if g.is_global or (_like(g.database, database) and (g.table is None or g.table == table)):
                    held |= g.privileges
            if "ALL PRIVILEGES" in held:
                held |= set(DML) | set(DDL)
            out[table] = frozenset(held)
        return out


def _normal(privilege: str) -> str:
    text = " ".join(privilege.upper().split())
    return "ALL PRIVILEGES" if text == "ALL" else text


def _top_level(text: str, keyword: str, start: int = 0) -> int:
    """Where ` keyword ` occurs outside quotes, backticks and parentheses, or -1."""
    quote, depth, i, upper, word = None, 0, start, text.upper(), f" {keyword} "
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                if i + 1 < len(text) and text[i + 1] == quote:  # a doubled quote is the quote itself
                    i += 1
                else:
                    quote = None
        elif ch in "`'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and upper.startswith(word, i):
            return i
        i += 1
    return -1


def _split_privileges(text: str) -> list[str]:
    parts, depth, current, quote = [], 0, [], None
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "`'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


_IDENT = r"(?:`(?:[^`]|``)*`|\*|[A-Za-z0-9_$]+)"
_TARGET = re.compile(rf"^(?:(?:TABLE|FUNCTION|PROCEDURE|PACKAGE BODY|PACKAGE)\s+)?({_IDENT})(?:\.({_IDENT}))?$", re.I)


def _identifier(token: str) -> str | None:
    if token == "*":
        return None
    if token.startswith("`"):
        return token[1:-1].replace("``", "`")
    return token


def parse_grant(line: str) -> Grant | str | None:
    """One line of SHOW GRANTS: a Grant, a role's name (a line granting a role), or None for a
    line that grants no privileges on tables (PROXY, REVOKE with partial revokes, ...)."""
    text = line.strip()
    if not text.upper().startswith("GRANT "):
        return None
    body = text[len("GRANT ") :]
    on = _top_level(" " + body, "ON")
    to = _top_level(" " + body, "TO")
    if on == -1 or (to != -1 and to < on):
        # GRANT `role`@`host` TO `user`@`host`: a role; its privileges are not on this line.
        return body[:to].strip() if to > 0 else body.strip()
    privileges_text = body[:on].strip()
    to_after = _top_level(" " + body, "TO", on + 1)
    target = body[on + 3 : to_after if to_after != -1 else len(body)].strip()
    if privileges_text.upper() == "PROXY":
        return None
    m = _TARGET.match(target)
    if not m:
        return None
    database = _identifier(m.group(1)) if m.group(2) is not None else None
    table = _identifier(m.group(2)) if m.group(2) is not None else None
    if m.group(2) is None and m.group(1) != "*":
        return None  # a stored routine or an unexpected form: no table privileges
    whole, columns = set(), set()
    for item in _split_privileges(privileges_text):
        name = _normal(item.split("(", 1)[0])
        (columns if "(" in item else whole).add(name)
    return Grant(frozenset(whole - {"USAGE"}), database, table, frozenset(columns))


def parse_grants(lines: Iterable[str]) -> Grants:
    grants, roles = [], []
    for line in lines:
        parsed = parse_grant(line)
        if isinstance(parsed, Grant):
            grants.append(parsed)
        elif isinstance(parsed, str):
            roles.append(parsed)
    return Grants(tuple(grants), tuple(roles))


def _like(pattern: str | None, name: str) -> bool:
    """A database in a GRANT may be a LIKE pattern (`jq\\_%`): `_` and `%` are wildcards unless
    escaped with a backslash."""
    if pattern is None:
        return True
    regex, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            regex.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        regex.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(regex), name, re.S) is not None
