"""The torch twins of jaxformer/layers/kernels/: blockwise and ring attention as references
(the same blocks and merges, in torch) and the reduced-precision decode weights. jaxformer's
expert-parallel exchange and partitioning metadata have no torch twin: torch_ref runs on one
device."""
