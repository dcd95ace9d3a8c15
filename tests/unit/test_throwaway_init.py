"""testkit.throwaway's initialisation (mariadb-install-db, mysqld --initialize), with a stand-in
command: one failure on a loaded machine is tried again on an empty datadir and reported, and a
second failure names its cause on the error's first line (the only line a CI summary prints)."""

from __future__ import annotations

import pytest

from testkit import throwaway

# Fails the first time it runs (leaving a half-made datadir behind), succeeds after; $1 is the
# datadir, $2 a marker that it has run once.
FLAKY = """
mkdir -p "$1/mysql"
if [ ! -e "$2" ]; then
    touch "$2" "$1/mysql/half-made"
    echo "Installing MariaDB/MySQL system tables in '$1' ..."
    echo "[ERROR] InnoDB: io_setup() failed with EAGAIN" >&2
    exit 1
fi
[ ! -e "$1/mysql/half-made" ] || { echo "[ERROR] tried again on the half-made datadir" >&2; exit 1; }
touch "$1/mysql/user.frm"
"""


def test_a_failed_initialisation_is_tried_again_on_an_empty_datadir_and_reported(tmp_path):
    datadir = tmp_path / "data"
    with pytest.warns(UserWarning, match="(?s)initialisation tried again.*io_setup"):
        throwaway._run_init(["sh", "-c", FLAKY, "sh", str(datadir), str(tmp_path / "ran")], "stand-in", datadir)
    assert sorted(p.name for p in (datadir / "mysql").iterdir()) == ["user.frm"]


def test_a_second_failure_names_its_cause_on_the_first_line(tmp_path):
    failing = 'echo "Installing ..."; echo "[ERROR] Can\'t create/write to file" >&2; exit 1'
    with pytest.raises(RuntimeError) as raised, pytest.warns(UserWarning):
        throwaway._run_init(["sh", "-c", failing], "stand-in", tmp_path / "data")
    first_line = str(raised.value).splitlines()[0]
    assert "stand-in failed twice (1)" in first_line and "Can't create/write to file" in first_line
