"""Parity cases for the full text models (classifier, seq2seq, lm). Filled by the models issue."""
