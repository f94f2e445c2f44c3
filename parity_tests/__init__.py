"""The parity suite: one registry of cases (registry.py), each checked for outputs, gradients
(test_parity.py) and, for model families, training trajectories (train tests)."""
