"""The anchor file on its own: appends from several processes, long lines, cut-off ends.

No database here: records are built and chained by ``recovery.anchors`` alone.
"""

from __future__ import annotations

import multiprocessing

import pytest

from recovery.anchors import FileAnchorStore, LedgerMark, anchor_index_read, appending
from recovery.errors import AnchorStoreError

PROCESSES = 4
APPENDS = 25


def append_records(path: str, count: int, tag: str) -> None:
    store = FileAnchorStore(path)
    for number in range(count):
        with appending(store) as session:
            session.append(
                at=f"{tag}-{number}",
                mode="incremental",
                ledger=LedgerMark(),
                gaps=(),
                heads=[("test.instance", tag, number + 1, "ab" * 32)],
            )


def test_appends_from_several_processes_at_once_keep_one_valid_chain(tmp_path):
    path = str(tmp_path / "folder" / "ledger.anchors")
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=append_records, args=(path, APPENDS, f"p{index}"))
        for index in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    index = anchor_index_read(FileAnchorStore(path))
    assert index.problem is None
    assert index.records == PROCESSES * APPENDS
    assert {subject_id: h.seq for (_, subject_id), h in index.heads.items()} == {
        f"p{i}": APPENDS for i in range(PROCESSES)
    }


def test_a_record_longer_than_a_read_is_chained_onto(tmp_path):
    store = FileAnchorStore(tmp_path / "ledger.anchors")
    heads = [("test.instance", str(n), 1, "cd" * 32) for n in range(2000)]  # ~180 KB
    for _ in range(3):
        with appending(store) as session:
            session.append(at="t", mode="full", ledger=LedgerMark(), gaps=(), heads=heads)
    FileAnchorStore._last.clear()  # read the last line from the file, not the cache
    with appending(store) as session:
        assert session.last.n == 3 and len(session.last.heads) == 2000
    assert anchor_index_read(store).records == 3


def test_a_cut_off_last_line_stops_appending_with_a_clear_message(tmp_path):
    path = tmp_path / "ledger.anchors"
    append_records(str(path), 2, "a")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(AnchorStoreError) as exc, appending(FileAnchorStore(path)):
        pass
    assert str(exc.value).startswith(
        f"The anchor file {path} ends with an incomplete line: a write was cut off (a crash "
        "before its fsync) or the file was edited. Nothing is appended after it."
    )


def test_a_second_writer_that_does_not_wait_is_told_the_store_is_busy(tmp_path):
    store = FileAnchorStore(tmp_path / "ledger.anchors")
    with appending(store) as first:
        assert first is not None
        with appending(store, wait=False) as second:
            assert second is None
    with appending(store, wait=False) as third:
        assert third is not None
