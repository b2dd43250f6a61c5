"""A trace file bounded in size: once it holds `max_bytes` of records past its opening snapshot it is rotated
(FILE → FILE.1 → … → FILE.<keep>, the oldest dropped) and the recorder starts the new file with a snapshot
(inventory, queues, what is held), so that every file replays on its own. A file is thus at most its snapshot
plus `max_bytes` plus one cycle's records; at most keep + 1 files exist."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from fairgpu.errors import InputError
from fairgpu.twin.encode import dumps

MIN_BYTES = 64 * 1024  # smaller than a snapshot of a big cluster, a file would rotate at every cycle


class TraceWriter:
    def __init__(self, path: Path, max_bytes: int = 100 << 20, keep: int = 3, option: str = "--record") -> None:
        """`option` names the path in errors (the command-line option or argument it came from)."""
        if max_bytes < MIN_BYTES:
            raise InputError(f"--record-max-mb: at least {MIN_BYTES / (1 << 20):g} MB")
        if keep < 0:
            raise InputError("--record-keep: must not be negative")
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise InputError(f"{option}: folder {folder} does not exist")
        if path.is_dir():
            raise InputError(f"{option}: {path} is a folder; give a file name")
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.rotations = 0
        if path.exists():  # an earlier run's trace is kept, not appended to: each file has one header
            self._shift()
        self._fh: TextIO = path.open("w", encoding="utf-8")
        self._size = 0
        self._floor = 0  # bytes of the snapshot that opens this file: not counted against max_bytes

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        text = "".join(dumps(rec) + "\n" for rec in records)
        if text:
            self._fh.write(text)
            self._fh.flush()  # a crash loses at most the cycle being written
            self._size += len(text.encode())

    def mark_snapshot(self) -> None:
        """What is written so far opens the file (header, inventory, what runs): not counted for rotation."""
        self._floor = self._size

    def full(self) -> bool:
        return self._size - self._floor >= self.max_bytes

    def rotate(self) -> None:
        self._fh.close()
        self._shift()
        self._fh = self.path.open("w", encoding="utf-8")
        self._size = self._floor = 0
        self.rotations += 1

    def _shift(self) -> None:
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        self._numbered(self.keep).unlink(missing_ok=True)
        for i in range(self.keep - 1, 0, -1):
            if self._numbered(i).exists():
                self._numbered(i).rename(self._numbered(i + 1))
        self.path.rename(self._numbered(1))

    def _numbered(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def close(self) -> None:
        self._fh.close()
