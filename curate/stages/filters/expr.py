"""``filter.expr``: keep the rows a SQL predicate holds for, e.g. ``where = "language_score > 0.8"``.

The predicate is parsed by polars' SQL parser into an expression and evaluated on whole
columns: it is data, never Python, so a job file cannot run code through it. It sees every
column of the batch: the core columns, the ones stages added (``quality``, ``lang``...) and the
input fields named in ``keep_fields``. As in SQL's ``WHERE``, a row is kept only when the
predicate is true; false or null (a missing value) rejects it as ``filter:expr`` (or
``filter:expr_<name>`` with ``name``, so two such stages give two reasons).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl
from polars.exceptions import (
    ColumnNotFoundError,
    ComputeError,
    InvalidOperationError,
    SQLInterfaceError,
    SQLSyntaxError,
)

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import Stage, StageConfig, StageContext, StageOutput

#: In the expression polars parses a predicate into, what reads other rows than the row's own: aggregations,
#: windows, ranks and row counts. Namespaced methods of one value (``str.head``, ``list.max``) are the row's own.
_ACROSS_ROWS = re.compile(
    r"(?<!str)(?<!list)(?<!arr)(?<!bin)(?<!dt)\.(max|min|mean|sum|count|median|std|var|first|last|quantile|n_unique"
    r"|rank|shift|cum_\w+|over|arg_max|arg_min|implode|head|tail|sort|unique|mode|product)\(|(?<![\w.])(len|int_range)\("
)


_NUMBER = r"-?[\d.]+(?:e[-+]?\d+)?"
#: A column compared with a number through polars' SQL comparisons (``n > 9.0``: ``col("n").sql_gt([9.0])``, or
#: ``9.0 < n``), which compare a text column as text.
_SQL_COMPARED = re.compile(
    rf'col\("((?:[^"\\]|\\.)*)"\)\.sql_\w+\(\[{_NUMBER}\]\)|{_NUMBER}\.sql_\w+\(\[col\("((?:[^"\\]|\\.)*)"\)\]\)'
)
_TYPED_COMPARED = re.compile(r'\(col\("((?:[^"\\]|\\.)*)"\)\) [<>=!]=? \(dyn (?:int|float): ')


def _compared_with_numbers(expr: pl.Expr) -> list[str]:
    """The columns ``expr`` compares with a number literal."""
    shown = str(expr)
    found = [a or b for a, b in _SQL_COMPARED.findall(shown)] + _TYPED_COMPARED.findall(shown)
    return sorted(set(found))


@dataclass(kw_only=True, slots=True)
class ExprConfig(StageConfig):
    """``where``: a polars SQL predicate over the batch's columns; ``name``: the reason's suffix."""

    where: str  # required: a SQL predicate over the batch's columns, e.g. "quality > 0.5 AND lang = 'en'"
    name: str = ""  # suffix of the reject reason (filter:expr_<name>), so two such stages give two reasons

    def __post_init__(self) -> None:
        if not self.where.strip():
            raise ConfigError(
                "where must be a SQL predicate, e.g. \"language_score > 0.8 AND dump LIKE 'CC-MAIN-2024%'\""
            )
        if self.name and not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ConfigError(f"filter.expr.name = {self.name!r} is invalid; allowed: lower-case letters, digits and _")
        try:
            expr = pl.sql_expr(self.where)
        except (SQLInterfaceError, SQLSyntaxError, ComputeError) as err:
            raise ConfigError(
                f"where = {self.where!r} is not a SQL predicate polars can parse: {_first_line(err)}"
            ) from None
        if _ACROSS_ROWS.search(str(expr)):
            raise ConfigError(
                f"where = {self.where!r} reads other rows (an aggregate or a window: MAX(x), COUNT(*), AVG, "
                "ROW_NUMBER() OVER ...), which filter.expr would compute within each batch, so what it keeps would "
                "depend on how the job is cut into batches; give a predicate of each row's own values (GREATEST and "
                "LEAST compare values within a row)"
            )


class ExprFilter(Stage):
    """Rejects rows for which ``where`` is not true."""

    kind = "filter.expr"
    Config = ExprConfig
    config: ExprConfig

    def __init__(self, config: ExprConfig, ctx: StageContext) -> None:
        super().__init__(config, ctx)
        self.reason = f"filter:expr_{config.name}" if config.name else "filter:expr"
        self.reasons = (self.reason,)
        self.predicate = pl.sql_expr(config.where)

    def apply(self, batch: pl.DataFrame) -> StageOutput:
        text = [c for c in _compared_with_numbers(self.predicate) if batch.schema.get(c) == pl.String]
        if text:  # polars compares them as text: '10' < '9.0', 'abc' > '9.0'
            raise StageError(
                f"stage {self.ctx.stage_id} (filter.expr): where = {self.config.where!r} compares the text column(s) "
                f"{text} with a number, which polars would do as text ('10' < '9.0'); type the field as a number "
                f'([[inputs]] keep_fields = {{{text[0]} = "float64"}}), or write CAST({text[0]} AS DOUBLE)'
            )
        try:
            keep = batch.select(self.predicate.alias("keep")).to_series()
        except ColumnNotFoundError as err:
            raise StageError(
                f"stage {self.ctx.stage_id} (filter.expr): where = {self.config.where!r} names a column the "
                f"rows lack: {_first_line(err)}; columns here: {batch.columns} (input fields need [[inputs]] "
                "keep_fields)"
            ) from None
        except (InvalidOperationError, ComputeError) as err:
            raise StageError(
                f"stage {self.ctx.stage_id} (filter.expr): where = {self.config.where!r} fails on these columns: "
                f"{_first_line(err)}"
            ) from None
        if keep.dtype != pl.Boolean:
            raise StageError(
                f"stage {self.ctx.stage_id} (filter.expr): where = {self.config.where!r} gives {keep.dtype} "
                "values, not true/false; write a comparison such as `quality > 0.5`"
            )
        keep = keep.fill_null(False)
        return StageOutput(batch.filter(keep), make_rejects(batch.filter(~keep), self.reason))


def _first_line(err: Exception) -> str:
    """polars' message without the expression trace newer versions append after a blank line: one line to read."""
    return str(err).strip().split("\n", 1)[0]
