"""The report page in headless Chromium: it loads with no console errors and every image decodes.

The page's own inline script writes ``data-images-ok`` / ``data-images-total`` / ``data-errors`` onto
``<body>``; ``--dump-dom`` prints the DOM after load, and ``--enable-logging=stderr`` prints every
console message as a ``CONSOLE`` line. Skipped only when Debian's ``chromium`` is not installed.
"""

import json
import re
import shutil
import subprocess

import pytest

from tests.pipelines.report_util import alert, healthy_records, write_job, write_run
from winnow.pipelines.report import write_report
from winnow.pipelines.report.page import CHECK_SCRIPT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)"),
]


def load_in_chromium(page, tmp_path) -> tuple[dict[str, str], list[str]]:
    """(attributes of <body> after load, console lines) for the HTML file ``page``."""
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", result.stdout)
    assert body, result.stdout[:500]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    return attrs, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def test_report_page_renders_in_chromium(tmp_path):
    job = write_job(tmp_path / "job")
    run = write_run(
        tmp_path / "run",
        healthy_records(),
        config={"shards": str(job)},
        alerts=[alert("loss_spike", 25, loss=9.0, sources=["code"], origins=[["a.parquet", 1]])],
    )
    with open(run / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {"step": 50, "attribution": {"sources": ["prose", "code"], "matrix": [[-0.2, 0.01], [0.0, -0.3]]}}
            )
            + "\n"
        )
    attrs, console = load_in_chromium(write_report(run), tmp_path)
    assert attrs.get("data-loaded") == "1"
    assert int(attrs["data-images-total"]) >= 10
    assert attrs["data-images-ok"] == attrs["data-images-total"]
    assert attrs["data-errors"] == "0" and console == []


def test_the_check_catches_a_broken_image_and_a_script_error(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        f"<!DOCTYPE html><html><head><script>{CHECK_SCRIPT}</script></head><body>"
        '<img alt="broken" src="data:image/png;base64,AAAA"><script>undefinedFunction()</script>'
        "</body></html>"
    )
    attrs, console = load_in_chromium(page, tmp_path)
    assert attrs["data-images-total"] == "1" and attrs["data-images-ok"] == "0"
    assert int(attrs["data-errors"]) >= 1
    assert any("undefinedFunction" in line for line in console)
