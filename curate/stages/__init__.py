"""The registry: job-file ``kind`` names to stage classes.

Stage modules are imported on first use, so a job pays only for the stages it names
(and optional dependencies fail only when their stage is used). Installed packages add
kinds through the ``winnow.stages`` entry-point group (``curate.stages.plugins``).
"""

from __future__ import annotations

import importlib

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import Barrier, Plan, Stage, StageConfig, StageContext, StageOutput
from winnow.curate.stages.plugins import GROUP, load_plugin, plugin_entry_points

_KINDS: dict[str, str] = {
    "clean": "winnow.curate.stages.clean:Clean",
    "filter.length": "winnow.curate.stages.filters.length:LengthFilter",
    "filter.gopher_quality": "winnow.curate.stages.filters.gopher:GopherQualityFilter",
    "filter.gopher_repetition": "winnow.curate.stages.filters.gopher_repetition:GopherRepetitionFilter",
    "filter.c4": "winnow.curate.stages.filters.c4:C4Filter",
    "filter.fineweb": "winnow.curate.stages.filters.fineweb:FineWebFilter",
    "filter.language": "winnow.curate.stages.filters.language:LanguageFilter",
    "filter.expr": "winnow.curate.stages.filters.expr:ExprFilter",
    "dedup.exact": "winnow.curate.dedup.exact:ExactDedup",
    "dedup.minhash": "winnow.curate.dedup.minhash:MinHashDedup",
    "score.heuristic": "winnow.curate.stages.scores.heuristic:HeuristicScore",
    "score.classifier": "winnow.curate.stages.scores.classifier:ClassifierScore",
    "score.dsir": "winnow.curate.stages.scores.dsir:DsirScore",
    "score.difficulty": "winnow.curate.stages.scores.difficulty:DifficultyScore",
    "split": "winnow.curate.stages.split:Split",
    "mix": "winnow.curate.stages.mix:Mix",
    "order": "winnow.curate.stages.order:Order",
}


def stage_kinds() -> list[str]:
    """Every kind a job file may name: the built-in ones and those installed packages register."""
    return sorted(set(_KINDS) | set(plugin_entry_points()))


def stage_class(kind: str, *, where: str = "") -> type[Stage]:
    """The class registered for ``kind``; ``where`` prefixes the error (file and table)."""
    target = _KINDS.get(kind)
    if target is None:
        plugin = load_plugin(kind, _KINDS)
        if plugin is not None:
            return plugin
        import difflib

        close = difflib.get_close_matches(kind, stage_kinds(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if ":" in kind or "/" in kind:
            hint += (
                f"; a job file names registered kinds only, never import paths: package your stage and register "
                f"it in the {GROUP!r} entry-point group"
            )
        raise ConfigError(
            f"{where}unknown stage kind {kind!r}{hint}; known kinds: {', '.join(stage_kinds())}"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["Barrier", "Plan", "Stage", "StageConfig", "StageContext", "StageOutput", "stage_class", "stage_kinds"]
