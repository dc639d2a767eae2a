"""The app tests' shared timing (tests/demo/conftest.py): a pair is timed once per session and setting, inside
each app's own timing call."""

from __future__ import annotations

import pytest
import torch

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import estimate
from demo.application import App
from demo.limits import Limits

pytestmark = pytest.mark.usefixtures("shared_rates")


def test_a_second_app_gets_the_first_apps_rates_and_another_setting_is_timed_anew(monkeypatch):
    timed, real = [], estimate.calibrate

    def counted(pair, sampling, csd, condition, on_step=None):
        timed.append(sampling.num_steps)
        return real(pair, sampling, csd, condition, on_step)

    monkeypatch.setattr(estimate, "calibrate", counted)

    def rates(steps: int):
        application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_steps=steps))
        out = application.rates(application.store.get(RANDOM_SOURCE.name))
        assert application.timings.timed(RANDOM_SOURCE.name)  # each app keeps its own rates
        return out

    first = rates(3)
    assert timed in ([3], [])  # [] where another module of the session timed this pair at 3 steps first
    assert rates(3) == first and timed in ([3], [])  # not timed again
    assert rates(2) != first and timed[-1:] == [2]  # another setting: timed
