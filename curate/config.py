"""The curation job as dataclasses: ``[job]``, ``[[inputs]]``, ``[[stages]]``, ``[output]``.

These are plain, validated dataclasses; ``pipelines.jobfile`` maps a TOML file onto them
(naming file, table and key in every error). Users of the Python API build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from winnow.curate.errors import ConfigError
from winnow.curate.names import path_name
from winnow.curate.stages.base import StageConfig
from winnow.curate.workdir import check_url, is_url, local_path, local_root

OUTPUT_FORMATS = ("parquet", "webdataset", "tokens")
MIN_TASK_BYTES = 1 << 20
DEFAULT_FORMATS = ("parquet", "webdataset")


@dataclass(kw_only=True, slots=True)
class JobSection:
    """``[job]``: what the job is called, where it writes, how it runs."""

    name: str  # the job's name: the default output folder is out/<name>
    output: str | None = None  # a folder or an fsspec URL; default: out/<name> (the name made a safe folder name)
    workers: int = 1  # local processes; 1 runs tasks in this process
    # local: a process pool on this machine; ray: the same tasks on a Ray cluster
    executor: Literal["local", "ray"] = "local"
    batch_rows: int = 8192  # rows per batch flowing through the stages
    # A file larger than this (as stored) is read as several tasks: JSONL byte ranges, Parquet row
    # groups, tar members, zstd frames; gzip and single-frame zstd stay one task.
    task_bytes: int = 256 << 20
    # Small JSONL files (under half of this) of one input are read together, in order, in
    # tasks of up to about this many bytes and 2000 files, so many small files make a few tasks and
    # shards; 0 reads each file as its own task. Plain text files are always grouped (up to task_bytes).
    group_bytes: int = 32 << 20
    on_error: Literal["raise", "skip"] = "raise"  # a file that cannot be opened at all
    seed: int = 0  # the default seed of every stage that samples or shuffles (mix, order)
    keep_work: bool = False  # keep the intermediate _work folder after success
    # Ids given by two rows: "reject" keeps the first and rejects later copies (read:duplicate_id,
    # one more map phase); "allow" skips the check, for inputs whose ids are known to be unique (rows that
    # do share an id stop a stage that decides by id, naming it; their WebDataset samples are <key>~~<k>).
    duplicate_ids: Literal["reject", "allow"] = "reject"
    # executor = "ray": the cluster to join ("host:port", "ray://host:port", "auto"); "" joins RAY_ADDRESS if set,
    # else starts a local Ray
    ray_address: str = ""
    # executor = "ray": re-runs of a task whose worker died (0: a re-run of the job resumes it)
    ray_max_retries: int = 3
    # fsspec options for an output URL (s3://...: endpoint_url, key, secret, ...), as inputs' storage_options
    storage_options: dict[str, Any] = field(default_factory=dict)
    # Memory the global phases (dedup grouping, components) may use for their data, in GB; they
    # split their work into as many partitions as that takes.
    memory_gb: float = 4.0

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\"):
            raise ConfigError(f"job.name = {self.name!r} is invalid; allowed: a non-empty name without slashes")
        if self.output is None:
            self.output = f"out/{path_name(self.name)}"
        elif not isinstance(self.output, str) or not self.output.strip():
            raise ConfigError(
                f"job.output = {self.output!r} is invalid; allowed: a folder or an fsspec URL (leave it out for "
                f"out/{path_name(self.name)})"
            )
        if is_url(self.output):  # an object store (s3://...): checked here so a missing driver fails before any work
            self.output = self.output.rstrip("/")
            check_url(self.output, "job.output", self.storage_options)
        else:  # file:///a is the folder /a (read as a path, a folder "file:" here), ~ the home folder
            self.output = str(local_path(self.output))
        if self.ray_address and self.executor != "ray":
            raise ConfigError(
                f"job.ray_address = {self.ray_address!r} is set but job.executor = {self.executor!r}; "
                f'set executor = "ray" to run on that cluster, or remove ray_address'
            )
        if self.ray_max_retries < 0:
            raise ConfigError(f"job.ray_max_retries = {self.ray_max_retries!r} is invalid; allowed: an integer >= 0")
        if self.workers < 1:
            raise ConfigError(f"job.workers = {self.workers!r} is invalid; allowed: an integer >= 1")
        if self.batch_rows < 1:
            raise ConfigError(f"job.batch_rows = {self.batch_rows!r} is invalid; allowed: an integer >= 1")
        if (
            not isinstance(self.memory_gb, (int, float))
            or isinstance(self.memory_gb, bool)
            or not 0 < self.memory_gb <= 1e6
        ):
            raise ConfigError(
                f"job.memory_gb = {self.memory_gb!r} is invalid; allowed: a number of GB > 0 and at most 1e6 (e.g. 4)"
            )
        if not isinstance(self.group_bytes, int) or isinstance(self.group_bytes, bool) or self.group_bytes < 0:
            raise ConfigError(
                f"job.group_bytes = {self.group_bytes!r} is invalid; allowed: an integer >= 0 "
                "(0 reads each input file as its own task)"
            )
        if not isinstance(self.task_bytes, int) or self.task_bytes < MIN_TASK_BYTES:
            raise ConfigError(
                f"job.task_bytes = {self.task_bytes!r} is invalid; allowed: an integer >= {MIN_TASK_BYTES} (1 MiB). "
                "Tasks that small spend their time starting up; the default, 268435456 (256 MiB), suits most jobs"
            )


@dataclass(kw_only=True, slots=True)
class InputConfig:
    """One ``[[inputs]]`` table: a source and where its files are."""

    path: str | list[str]  # file, folder or glob; local or any fsspec URL (s3://...)
    source: str | None = None  # the source name every row of these files gets (or give source_field)
    source_field: str | None = None  # take each row's source from this field instead
    # how the files are read; hf: a datasets save_to_disk folder or hf_builder files
    format: Literal["jsonl", "parquet", "webdataset", "hf", "text"] = "jsonl"
    text_field: str = "text"  # the field holding the document text
    id_field: str = "id"  # the field holding a row's id; rows without one get <source>/<file>@<offset>
    hf_builder: str | None = None  # format = "hf": load local files through load_dataset(builder, ...)
    hf_split: str | None = None  # format = "hf", a saved DatasetDict: the split to read (one of several needs it)
    storage_options: dict[str, Any] = field(default_factory=dict)  # passed to fsspec
    # fields moved out of meta into typed columns: names (types inferred) or {name = "string"|"int64"|...}
    keep_fields: list[str] | dict[str, str] = field(default_factory=list)
    # A record (JSONL line, text file, tar member, Parquet text) longer than this is a read:too_long reject,
    # read past without holding it: memory stays bounded whatever one line holds.
    max_record_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_record_bytes, bool)
            or not isinstance(self.max_record_bytes, int)
            or self.max_record_bytes < 1
        ):
            raise ConfigError(
                f"inputs.max_record_bytes = {self.max_record_bytes!r} is invalid; allowed: an integer >= 1 "
                f"(bytes; the default, {64 << 20}, is 64 MiB)"
            )
        if (self.source is None) == (self.source_field is None):
            raise ConfigError(
                "inputs.source / inputs.source_field: give exactly one of source (a name) or source_field "
                "(a column holding it)"
            )
        if self.hf_builder is not None and self.format != "hf":
            raise ConfigError(
                f"inputs.hf_builder = {self.hf_builder!r} reads files through a Hugging Face builder, for format = "
                f'"hf" only (this input\'s format is {self.format!r}); set format = "hf", or remove hf_builder'
            )
        if self.hf_split is not None and (self.format != "hf" or self.hf_builder is not None or not self.hf_split):
            raise ConfigError(
                f"inputs.hf_split = {self.hf_split!r} names the split of a saved Hugging Face DatasetDict to read: "
                'for format = "hf" without hf_builder only (a builder reads each file as one split), a non-empty name'
            )
        named = {"text_field": self.text_field, "id_field": self.id_field, "source_field": self.source_field}
        named = {k: v for k, v in named.items() if k != "source_field" or v is not None}
        for key, value in named.items():
            if not isinstance(value, str) or not value:
                raise ConfigError(f"inputs.{key} = {value!r} is invalid; allowed: a non-empty field name")
        if len(set(named.values())) < len(named):
            raise ConfigError(
                f"inputs: {', '.join(f'{k} = {v!r}' for k, v in named.items())} name one field twice; "
                "the text, the id and the source are different fields"
            )
        if self.source is not None and (not self.source or "/" in self.source):
            raise ConfigError(f"inputs.source = {self.source!r} is invalid; allowed: a non-empty name without '/'")
        if isinstance(self.path, str):
            self.path = [self.path]
        if not self.path:
            raise ConfigError("inputs.path = [] is invalid; allowed: at least one file, folder or glob")
        blank = next((p for p in self.path if not isinstance(p, str) or not p.strip()), None)
        if blank is not None:
            raise ConfigError(
                f"inputs.path holds {blank!r}; allowed: file, folder or glob paths (a folder is read whole; the "
                "output may not lie inside it)"
            )
        from winnow.curate.fields import check_fields  # curate.fields needs this module's Job type
        from winnow.curate.schema import CORE_COLUMNS, OPTIONAL_COLUMNS, REJECT_COLUMNS

        check_fields(self.keep_fields, (*CORE_COLUMNS, *OPTIONAL_COLUMNS, *REJECT_COLUMNS, "stage", "extra"))

    @property
    def paths(self) -> list[str]:
        return list(self.path)

    @property
    def label(self) -> str:
        return self.source or f"<{self.source_field}>"


@dataclass(kw_only=True, slots=True)
class TokensConfig:
    """``[output.tokens]``: the tokenizer the ``tokens`` format writes with."""

    tokenizer: str = "byte"  # "byte" or the path of a Hugging Face tokenizer.json
    # end-of-document token; None: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> the vocabulary has
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if not self.tokenizer:
            raise ConfigError("output.tokens.tokenizer must be 'byte' or the path of a tokenizer.json, got ''")
        if self.eos_token == "":
            raise ConfigError(
                "output.tokens.eos_token = '' names no token; give the tokenizer's end-of-document token, or leave "
                "it out to use the first of the usual ones its vocabulary holds"
            )
        from winnow.curate.writers.tokens import (
            shard_tokenizer,  # loads it once: a bad file fails here, not in a worker
        )

        shard_tokenizer(self.tokenizer, self.eos_token)


@dataclass(kw_only=True, slots=True)
class OutputConfig:
    """``[output]``: shard formats and sizes."""

    # any of parquet, webdataset, tokens (Megatron .bin/.idx token shards)
    formats: list[str] = field(default_factory=lambda: list(DEFAULT_FORMATS))
    # A shard holds about this many uncompressed row bytes (as `datasets`' max_shard_size counts): a tar's
    # size for long documents (each sample adds 1-2 KiB of headers and padding); zstd Parquet is several times smaller.
    shard_bytes: int = 256 * 2**20
    shard_rows: int | None = None  # also cap rows per shard; whichever limit comes first
    row_group_bytes: int = 32 * 2**20  # Parquet row groups of about this many uncompressed bytes
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"  # Parquet compression codec
    # e.g. 0o640: permission bits of every file written (folders add search bits); default: the umask
    mode: int | None = None
    tokens: TokensConfig = field(default_factory=TokensConfig)  # used when "tokens" is in formats

    def __post_init__(self) -> None:
        if self.mode is not None and not (0 <= self.mode <= 0o777 and self.mode & 0o600 == 0o600):
            raise ConfigError(
                f"output.mode = {oct(self.mode)} is invalid; allowed: permission bits from 0o600 to 0o777 "
                f"that let the owner read and write (e.g. 0o640)"
            )
        bad = [f for f in self.formats if f not in OUTPUT_FORMATS]
        if bad or not self.formats or len(set(self.formats)) < len(self.formats):
            raise ConfigError(
                f"output.formats = {self.formats!r} is invalid; allowed: a non-empty list from {list(OUTPUT_FORMATS)}, "
                "each once"
            )
        if self.shard_rows is not None and self.shard_rows < 1:
            raise ConfigError(f"output.shard_rows = {self.shard_rows!r} is invalid; allowed: an integer >= 1 or unset")
        for key in ("shard_bytes", "row_group_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"output.{key} = {getattr(self, key)!r} is invalid; allowed: an integer >= 1 (bytes)")


@dataclass(kw_only=True, slots=True)
class StageSpec:
    """One ``[[stages]]`` table: its kind and its validated config."""

    kind: str
    config: StageConfig


@dataclass(kw_only=True, slots=True)
class Job:
    """A whole curation job."""

    job: JobSection
    inputs: list[InputConfig]
    stages: list[StageSpec] = field(default_factory=list)
    output: OutputConfig = field(default_factory=OutputConfig)
    source_file: str | None = None  # the job file, when loaded from one
    raw: dict[str, Any] = field(default_factory=dict)  # the job file as parsed, for the manifest

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError("a job needs at least one [[inputs]] table")
        if is_url(self.job.output) and self.output.mode is not None:
            raise ConfigError(
                f"output.mode = {oct(self.output.mode)} applies to local folders; job.output = "
                f"{self.job.output!r} is on an object store, whose access the bucket's policy sets: "
                f"remove output.mode"
            )

    @property
    def output_dir(self) -> Path:
        """The output folder as this process sees it: ``[job] output``, or for a URL its local mirror (``curate.workdir``)."""
        return local_root(self.job.output)

    @property
    def declared_sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i.source for i in self.inputs if i.source is not None))
