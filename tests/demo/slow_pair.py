"""The untrained pair slowed down, for the app tests: a sleep in each backbone pass of its models (a forward
pre-hook on the first block), so its runs last long enough to stop midway, and its timing is still under way
when a request comes."""

from __future__ import annotations

import time
from dataclasses import replace

from csd.serving.pairs import RANDOM_SOURCE, PairSource

STEP_DELAY = 0.02  # seconds added to every backbone pass


def slowed(name: str = RANDOM_SOURCE.name) -> PairSource:
    """The untrained pair's source, named ``name``, each backbone pass of its models :data:`STEP_DELAY` longer."""

    def load(device):
        pair = replace(RANDOM_SOURCE.load(device), name=name)
        for model in (pair.target, pair.draft):
            model.encoder_blocks[0].register_forward_pre_hook(lambda module, args: time.sleep(STEP_DELAY))
        return pair

    return replace(RANDOM_SOURCE, name=name, load=load)
