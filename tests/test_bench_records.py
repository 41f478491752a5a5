"""The benchmarks' record counter: only complete lines count, each read once."""

from __future__ import annotations

from bench.records import RecordCounter


def test_counts_complete_lines_with_the_prefix_reading_only_what_was_appended(tmp_path):
    path = tmp_path / "records.txt"
    counter = RecordCounter(path, "w2-")
    assert counter.update() == 0  # no file yet

    path.write_bytes(b"warmup-0 1 2 3\nw2-00001 1 2 3\nw2-000")
    assert counter.update() == 1  # the last line is not complete yet
    with open(path, "ab") as handle:
        handle.write(b"02 1 2 3\nw2-00003 1 2 3\n")
    assert counter.update() == 3
    assert counter.update() == 3  # nothing new: nothing counted twice


def test_wait_for_returns_what_is_there_when_the_time_is_up(tmp_path):
    path = tmp_path / "records.txt"
    path.write_text("a\nb\n")
    assert RecordCounter(path).wait_for(5, timeout_s=0.1, poll_s=0.01) == 2
    assert RecordCounter(path).wait_for(2, timeout_s=5) == 2
