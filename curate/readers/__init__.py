"""Readers: every input format streamed as batches of rows plus the records that could not be read.

``plan_read_tasks`` turns the job's ``[[inputs]]`` into read tasks (one per file; plain text
files grouped), and ``read_task`` streams one task. Read errors become rejects with a
``read:<error>`` reason (``READ_REASONS``); only a file that cannot be opened at all raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from curate.config import InputConfig
from curate.readers.arrow import read_hf, read_parquet
from curate.readers.files import InputFile, list_files
from curate.readers.jsonl import read_jsonl
from curate.readers.rows import READ_REASONS, ReadBatch
from curate.readers.text import read_text_files
from curate.readers.webdataset import read_webdataset

_PER_FILE = {"jsonl": read_jsonl, "parquet": read_parquet, "webdataset": read_webdataset, "hf": read_hf}
TEXT_TASK_FILES = 2000  # plain text inputs: files per task
TEXT_TASK_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One unit of reading: an input and the files (one, or a group of text files) it covers."""

    input_index: int
    files: tuple[InputFile, ...]

    @property
    def label(self) -> str:
        return self.files[0].url if len(self.files) == 1 else f"{self.files[0].url} (+{len(self.files) - 1} files)"


def plan_read_tasks(inputs: list[InputConfig]) -> list[ReadTask]:
    """List every input's files and group them into read tasks, in a stable order."""
    tasks: list[ReadTask] = []
    for index, cfg in enumerate(inputs):
        files = list_files(cfg)
        if cfg.format != "text":
            tasks.extend(ReadTask(index, (f,)) for f in files)
            continue
        group: list[InputFile] = []
        size = 0
        for f in files:
            if group and (len(group) >= TEXT_TASK_FILES or size + f.size > TEXT_TASK_BYTES):
                tasks.append(ReadTask(index, tuple(group)))
                group, size = [], 0
            group.append(f)
            size += f.size
        if group:
            tasks.append(ReadTask(index, tuple(group)))
    return tasks


def read_task(cfg: InputConfig, task: ReadTask, batch_rows: int) -> Iterator[ReadBatch]:
    """Stream one read task's batches."""
    if cfg.format == "text":
        yield from read_text_files(cfg, list(task.files), batch_rows)
        return
    for file in task.files:
        yield from _PER_FILE[cfg.format](cfg, file, batch_rows)


__all__ = ["READ_REASONS", "InputFile", "ReadBatch", "ReadTask", "list_files", "plan_read_tasks", "read_task"]
