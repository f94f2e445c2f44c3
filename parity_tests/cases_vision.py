"""Parity cases for ViT, Swin and the TCN-Transformer. Filled by the vision/time-series issue."""
