"""docs/claim-sql.md is what claim_sql builds: every statement shape of the claim as MariaDB and
MySQL receive it."""

from pathlib import Path

from jobqueue.core.repository import claim_sql

DOC = Path(__file__).resolve().parents[2] / "docs" / "claim-sql.md"


def test_the_claim_sql_document_is_up_to_date():
    assert DOC.read_text() == claim_sql.document(), (
        "docs/claim-sql.md is stale: run `python -m jobqueue.core.repository.claim_sql > docs/claim-sql.md`"
    )


def test_every_shape_is_in_the_document():
    text = DOC.read_text()
    assert all(f"## {shape.name}\n" in text for shape in claim_sql.SHAPES)
