"""Stop signals: the first asks for a checkpoint, a second stops at once, and the handlers are put back."""

import os
import signal

import pytest

from winnow.train.shutdown import on_stop_signals, stop_requested


def test_first_signal_asks_second_stops_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        with on_stop_signals(seen.append):
            os.kill(os.getpid(), signal.SIGTERM)
            assert seen == [signal.SIGTERM] and stop_requested() == signal.SIGTERM
            os.kill(os.getpid(), signal.SIGINT)
    assert stop_requested() is None
    assert signal.getsignal(signal.SIGTERM) is before
