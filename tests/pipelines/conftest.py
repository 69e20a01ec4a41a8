"""Fixtures shared by the pipelines tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """The tiny models here train faster on one intra-op thread than on two fighting a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
