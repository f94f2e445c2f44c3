"""The batch-size errors say what is wrong the right way round: the batch is not divisible by
what splits it, and what to use instead. Config checks only (no model is built)."""
from __future__ import annotations

import pytest

from jaxformer.config import ConfigError
from jaxformer.train.config import load_config


@pytest.mark.parametrize("sets, want", [
    (["parallel.mode=pmap", "parallel.num_devices=3", "train.batch_size=8", "train.grad_accum_steps=2"],
     "train.batch_size=8 is not divisible by grad_accum_steps=2 x parallel.num_devices=3 = 6: use a multiple of 6"),
    (["parallel.mode=mesh", "parallel.mesh.data=3", "train.batch_size=8", "train.grad_accum_steps=2"],
     "train.batch_size / grad_accum_steps = 4 is not divisible by parallel.mesh data x fsdp x expert = 3: "
     "use a batch_size that is a multiple of 6"),
])
def test_batch_size_errors_read_the_right_way_round(sets, want):
    with pytest.raises(ConfigError) as e:
        load_config("lm", sets)  # check_sections runs as the config loads
    assert want in str(e.value)
    assert "divide into" not in str(e.value)
