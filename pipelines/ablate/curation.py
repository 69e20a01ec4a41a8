"""The job a curation study varies: its stages by reference, and each variant's job (drop, set, re-order).

A variant is the baseline job file with one change, as data (``change`` of a planned variant):
``{"drop": [stage ids]}``, ``{"set": {"stage": id, "key": "threshold", "value": 0.7}}`` or
``{"order": "shuffled" | "reversed"}``. ``CurationJob.variant`` applies it to the parsed TOML and
validates the result through ``pipelines.jobfile`` like any job file, so a value a stage's config
refuses is refused here, before anything is curated, with the study key that asked for it.
``order = "shuffled"`` orders by ``random`` (the same rows, a seeded shuffle, the sources'
shares in every window kept) and ``"reversed"`` flips ``direction``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from winnow.curate.config import Job
from winnow.curate.errors import ConfigError
from winnow.curate.stages import stage_class
from winnow.curate.stages.ids import job_stages
from winnow.pipelines.jobfile import job_from_dict, read_toml

#: the tables of a job file that make the curation job (a study file also holds [train] and [ablate])
JOB_TABLES = ("job", "inputs", "stages", "output")


@dataclass(frozen=True, slots=True)
class CurationJob:
    """The baseline curation job of a study: its file, its tables as parsed, and the validated job."""

    path: str
    raw: dict
    job: Job

    @property
    def stage_ids(self) -> list[str]:
        """``01.clean``, ``02.filter.length``, ...: the ids its stages run under (``curate.stages.ids``)."""
        return [
            sid
            for sid, _, _ in job_stages(
                dataclasses.replace(self.job, job=dataclasses.replace(self.job.job, duplicate_ids="allow"))
            )
        ]

    @property
    def output(self) -> str:
        return self.job.job.output

    def index(self, ref: str | int, key: str) -> int:
        """The position of the stage ``ref`` names: a kind (naming one stage), a stage id, or a [[stages]] number."""
        ids = self.stage_ids
        listing = ", ".join(f"{i + 1} = {sid!r}" for i, sid in enumerate(ids))
        allowed = f"a [[stages]] number, stage id or kind of {self.path}: {listing}"
        if isinstance(ref, int) and not isinstance(ref, bool):
            if 1 <= ref <= len(ids):
                return ref - 1
            raise ConfigError(f"{key} = {ref!r} is not a stage of the job; allowed: {allowed}")
        if isinstance(ref, str):
            if ref in ids:
                return ids.index(ref)
            kinds = [i for i, spec in enumerate(self.job.stages) if spec.kind == ref]
            if len(kinds) == 1:
                return kinds[0]
            if len(kinds) > 1:
                raise ConfigError(
                    f"{key} = {ref!r} names {len(kinds)} stages of the job "
                    f"({', '.join(ids[i] for i in kinds)}); give one stage id or [[stages]] number"
                )
        close = difflib.get_close_matches(str(ref), ids + [s.kind for s in self.job.stages], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key} = {ref!r} is not a stage of the job{hint}; allowed: {allowed}")

    def name(self, index: int) -> str:
        """How a variant name refers to a stage: its kind when no other stage has it, else its id."""
        kind = self.job.stages[index].kind
        return kind if sum(s.kind == kind for s in self.job.stages) == 1 else self.stage_ids[index]

    def setting(self, dotted: str, key: str) -> tuple[int, str, Any]:
        """``"<stage>.<key>"`` → (stage position, key path within its table, the job's value there or None).

        The stage part is the longest prefix naming a stage (a kind or an id, which hold dots themselves);
        the key must be a field of that stage's config, a nested key only inside a table-valued one.
        """
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            ref = ".".join(parts[:cut])
            if ref in self.stage_ids or any(s.kind == ref for s in self.job.stages):
                index = self.index(ref, key)
                path = parts[cut:]
                break
        else:
            raise ConfigError(
                f"{key}: {dotted!r} does not start with a stage of the job; allowed: "
                f"'<stage>.<key>' with <stage> one of {self.stage_ids} or their kinds, "
                "e.g. 'dedup.minhash.threshold'"
            )
        spec = self.job.stages[index]
        config = spec.config
        fields = {f.name: f for f in dataclasses.fields(config)}
        if path[0] not in fields:
            close = difflib.get_close_matches(path[0], fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{key}: {path[0]!r} is not a key of stage {self.stage_ids[index]} ({spec.kind}){hint}; "
                f"allowed: {', '.join(sorted(fields))}"
            )
        value = getattr(config, path[0])
        if len(path) > 1:
            hint = typing.get_type_hints(type(config))[path[0]]
            if typing.get_origin(hint) is not dict and not isinstance(value, dict):
                raise ConfigError(
                    f"{key}: {path[0]!r} of stage {self.stage_ids[index]} is not a table, so "
                    f"{'.'.join(path)!r} names nothing; allowed: '{path[0]}' itself"
                )
            for part in path[1:]:
                value = value.get(part) if isinstance(value, dict) else None
        return index, ".".join(path), value

    def variant(self, change: dict, output: str | Path, *, key: str) -> Job:
        """The job with ``change`` applied, writing to ``output``; a ``ConfigError`` naming ``key`` when it is invalid."""
        raw = copy.deepcopy(self.raw)
        stages = raw.get("stages", [])
        ids = self.stage_ids
        if "drop" in change:
            gone = {ids.index(sid) for sid in change["drop"]}
            raw["stages"] = [t for i, t in enumerate(stages) if i not in gone]
        elif "set" in change:
            table = stages[ids.index(change["set"]["stage"])]
            *path, last = change["set"]["key"].split(".")
            for part in path:
                table = table.setdefault(part, {})
            table[last] = change["set"]["value"]
        elif "order" in change:
            table = stages[self.order_stage(key)]
            if change["order"] == "shuffled":
                table.update(by="random", pacing="sorted")
            else:
                table["direction"] = (
                    "hard_to_easy" if table.get("direction", "easy_to_hard") == "easy_to_hard" else "easy_to_hard"
                )
        else:
            raise AssertionError(f"unknown change {change}")
        try:
            return job_from_dict(raw, source_file=self.path, output=str(output))
        except ConfigError as err:
            raise ConfigError(f"{key}: the job with this change is refused: {err}") from None

    def order_stage(self, key: str) -> int:
        """The position of the job's ``order`` stage; order variants need one that a load-time mix keeps."""
        found = [i for i, s in enumerate(self.job.stages) if stage_class(s.kind).orders_output]
        if not found:
            raise ConfigError(
                f"{key}: the job ({self.path}) has no order stage, so it has no curriculum to compare; "
                "allowed: a job with an [[stages]] kind = 'order' table, or a kind list without 'order'"
            )
        config = self.job.stages[found[0]].config
        if getattr(config, "by", None) == "random":
            raise ConfigError(
                f"{key}: the job's order stage ({self.stage_ids[found[0]]}) is already by = 'random' "
                "(shuffled); allowed: a curriculum (by = a column or 'length') to compare with it"
            )
        if not getattr(config, "stratify", True):
            raise ConfigError(
                f"{key}: the job's order stage ({self.stage_ids[found[0]]}) lays the sources out one "
                "after the other (stratify = false), but every run of a study mixes the sources at load "
                "time, each keeping its curated order, which keeps a stratified curriculum only; allowed: "
                "an order stage with stratify = true"
            )
        return found[0]


def load_curation_job(study_file: str | Path, raw: dict, job_file: str | None) -> CurationJob | None:
    """The job ``[ablate] job`` names, else the study file's own [[inputs]] and [[stages]]; None when neither is there."""
    if job_file is not None:
        path, tables = str(job_file), read_toml(job_file)
    elif raw.get("inputs") and raw.get("stages"):
        path, tables = str(study_file), raw
    else:
        return None
    own = {k: v for k, v in tables.items() if k in JOB_TABLES}
    return CurationJob(path=path, raw=own, job=job_from_dict(own, source_file=path))
