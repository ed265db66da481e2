"""The demo projection's group commit: writes waiting together commit together,
and each write's failure stays its own."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from wakuwaku import ErrorClass
from wakuwaku.demo.flights import PlaneRegistered, Projection
from wakuwaku.engine.classifiers import classify_sqlite


def _plane(tailnum: str) -> PlaneRegistered:
    return PlaneRegistered(tailnum, 2004, "EMBRAER", "ERJ 190", 100)


def _planes(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT tailnum FROM planes")}
    finally:
        conn.close()


async def test_a_failing_write_rolls_back_only_itself(tmp_path: Path) -> None:
    projection = Projection(tmp_path / "p.db")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO planes VALUES ('N2', NULL, 'x', 'y', NULL)")
        raise ValueError("this chunk fails after writing")

    try:
        results = await asyncio.gather(
            projection.register([_plane("N1")]),
            projection._writer.write(broken),
            projection.register([_plane("N3")]),
            return_exceptions=True,
        )
    finally:
        projection.close()
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ValueError)
    assert _planes(tmp_path / "p.db") == {"N1", "N3"}  # N2 rolled back with its write


async def test_a_projection_locked_by_another_process_fails_every_write_transient(
    tmp_path: Path,
) -> None:
    projection = Projection(tmp_path / "p.db")
    other = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        results = await asyncio.gather(
            projection.register([_plane("N1")]),
            projection.register([_plane("N2")]),
            return_exceptions=True,
        )
        for result in results:
            assert isinstance(result, sqlite3.OperationalError)
            assert classify_sqlite(result) is ErrorClass.TRANSIENT
        other.execute("ROLLBACK")
        # The writer is usable again once the lock is gone.
        await projection.register([_plane("N3")])
    finally:
        other.close()
        projection.close()
    assert _planes(tmp_path / "p.db") == {"N3"}


async def test_close_stops_the_writer_once(tmp_path: Path) -> None:
    projection = Projection(tmp_path / "p.db")
    pending = [asyncio.ensure_future(projection.register([_plane(f"N{i}")])) for i in range(50)]
    await asyncio.gather(*pending)
    projection.close()
    projection.close()  # a second close does nothing
    assert len(_planes(tmp_path / "p.db")) == 50


@pytest.mark.parametrize("count", [1, 300])
async def test_every_write_of_a_group_is_committed(tmp_path: Path, count: int) -> None:
    # More writes than one group takes (GROUP_COMMIT_MAX) still all commit.
    projection = Projection(tmp_path / "p.db")
    try:
        await asyncio.gather(*(projection.register([_plane(f"N{i}")]) for i in range(count)))
    finally:
        projection.close()
    assert len(_planes(tmp_path / "p.db")) == count
