"""The report: one self-contained HTML page for a curation job, a training run, or both, plus diagnosis."""

from winnow.pipelines.report.diagnose import DiagnoseConfig, Finding, diagnose, format_findings
from winnow.pipelines.report.page import locate, render, write_report

__all__ = ["DiagnoseConfig", "Finding", "diagnose", "format_findings", "locate", "render", "write_report"]
