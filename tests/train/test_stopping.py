"""Early stopping on a scripted sequence of evaluations: patience, min_delta, named sources, thresholds."""

import pytest

from winnow.train.errors import ConfigError
from winnow.train.stopping import EarlyStopping, StopConfig


def _evals(losses, per_source=None):
    for i, loss in enumerate(losses):
        yield {"step": 10 * (i + 1), "eval": {"loss": loss, "per_source": (per_source or (lambda i: {}))(i)}}


def _first_stop(stopper, records):
    for record in records:
        if stopper.update(record):
            return record["step"]
    return None


def test_patience_stops_at_the_right_eval():
    # improvements of 0.5, 0.3, then 0.05 (< min_delta), 0.2 worse, 0.01 better: two bad evals in a row at step 50
    stopper = EarlyStopping(StopConfig(patience=2, min_delta=0.1))
    assert _first_stop(stopper, _evals([3.0, 2.5, 2.2, 2.15, 2.4, 2.19, 1.0])) == 50
    assert "not improved by more than min_delta=0.1 over its best 2.2000 (step 30) for 2 evaluations" in stopper.reason


def test_a_loss_below_the_best_by_min_delta_or_less_is_no_improvement_and_the_reason_says_so():
    stopper = EarlyStopping(StopConfig(patience=2, min_delta=0.1))
    assert _first_stop(stopper, _evals([3.0, 2.95, 2.92])) == 30  # below 3.0 each time, by 0.1 or less
    assert stopper.reason == (
        "held-out loss has not improved by more than min_delta=0.1 over its best 3.0000 (step 10) for 2 "
        "evaluations (now 2.9200 at step 30)"
    )


def test_an_improvement_resets_the_patience():
    stopper = EarlyStopping(StopConfig(patience=2))
    assert _first_stop(stopper, _evals([3.0, 3.1, 2.9, 3.0, 2.8, 2.85, 2.86])) == 70


def test_named_sources_are_watched_instead_of_the_total():
    def per_source(i):
        return {"old": [2.0, 1.9, 1.8, 1.7][i], "new": [3.0, 3.0, 3.0, 3.0][i]}

    total = [2.5, 2.45, 2.4, 2.35]  # the total improves throughout: only "new" has flattened
    assert _first_stop(EarlyStopping(StopConfig(patience=2, sources=["new"])), _evals(total, per_source)) == 30
    assert _first_stop(EarlyStopping(StopConfig(patience=2)), _evals(total, per_source)) is None


def test_threshold_stops_as_soon_as_a_source_crosses_it():
    def per_source(i):
        return {"code": [2.0, 1.6, 1.4, 1.2][i]}

    stopper = EarlyStopping(StopConfig(thresholds={"code": 1.5}))
    assert _first_stop(stopper, _evals([9, 9, 9, 9], per_source)) == 30
    assert stopper.reason.startswith("held-out loss of code is 1.4000 at step 30, at or below its threshold 1.5")


def test_state_round_trips_and_config_errors_name_the_key():
    stopper = EarlyStopping(StopConfig(patience=2))
    assert _first_stop(stopper, _evals([3.0, 3.1])) is None
    again = EarlyStopping(StopConfig(patience=2))
    again.load_state_dict(stopper.state_dict())
    assert _first_stop(again, _evals([3.2])) == 10 and "best 3.0000 (step 10)" in again.reason
    with pytest.raises(ConfigError, match="train.stop.patience"):
        StopConfig(patience=-1)
    with pytest.raises(ConfigError, match="train.stop.sources"):
        EarlyStopping(StopConfig(patience=1, sources=["web"])).update(
            {"step": 1, "eval": {"loss": 1, "per_source": {"code": 1}}}
        )
