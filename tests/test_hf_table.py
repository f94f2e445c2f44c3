"""Every row of the HF family table (tests/hf_rows.py) through one round trip
(hf_helpers.check_round_trip): a tiny random HF model of an odd configuration (no download),
saved and imported; its config fields; logits within 1e-5 x max(1, max|logit|) fp32 with a
left-padded row (an encoder's every output, with a right-padded row too); greedy and beam ids
equal to HF generate's where the row asks; the export loaded back by transformers with the
row's config keys and identical logits. The families' own checks are in tests/test_hf_<family>.py.
"""
from __future__ import annotations

import pytest
from hf_helpers import built, check_round_trip
from hf_rows import ROWS

from jaxformer.parity import setup_precision

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_import_generate_export(row, tmp_path_factory, tmp_path):
    check_round_trip(row, *built(row, tmp_path_factory), str(tmp_path / "out"))
