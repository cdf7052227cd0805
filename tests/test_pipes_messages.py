"""The local trainer launch's Pipes reader hands over whole message lines only (assets/pipes_messages.py)."""

from __future__ import annotations

import json
import threading
import time

from assets.pipes_messages import WholeLineMessages, complete_lines


class Collect:
    """A Pipes message handler that keeps what it is given."""

    def __init__(self):
        self.messages, self.errors = [], []

    def handle_message(self, message):
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin, exc_info):
        self.errors.append((origin, exc_info[1]))


def test_a_message_seen_half_written_is_handed_over_once_whole():
    handler, reader = Collect(), WholeLineMessages()
    first, second = {"method": "report_custom_message", "params": {"payload": {"kind": "status", "step": 3}}}, {"method": "closed"}
    with reader.read_messages(handler) as params:
        path = params["path"]
        text = json.dumps(first)
        with open(path, "a", encoding="utf-8") as f:  # the first half, flushed, as a reader can catch it
            f.write(text[:20])
            f.flush()
            time.sleep(0.1)  # the tail polls every 10 ms: it reads the half line more than once
            f.write(text[20:] + "\n")
            f.flush()
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(second) + "\n")
    assert handler.errors == [] and handler.messages == [first, second]


def test_a_line_at_the_end_of_the_file_without_its_newline_waits_for_the_rest(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    calls = []

    def should_stop() -> bool:
        """Called each time the tail is at the end of the file: the first time, the writer finishes
        its line; the second, it is done."""
        calls.append(1)
        if len(calls) == 1:
            with open(path, "a", encoding="utf-8") as f:
                f.write('2}\n')
        return len(calls) > 1

    assert list(complete_lines(str(path), should_stop)) == ['{"a": 1}\n', '{"b": 2}\n'] and len(calls) == 2


def test_the_tail_stops_at_the_end_once_told_and_leaves_out_an_unfinished_last_line(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    stop = threading.Event()
    stop.set()
    assert list(complete_lines(str(path), stop.is_set)) == ['{"a": 1}\n', '{"b": 2}\n']
