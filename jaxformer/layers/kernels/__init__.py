"""The speed and parallel machinery under the layers: how the maths in jaxformer/layers/ is
computed fast or spread over devices, never what it computes. Twin: torch_ref/layers/kernels/.

    blockwise.py     attention in [bq, bk] blocks with an online softmax, O(T) memory
    ring.py          ring attention over a mesh's context axis (context parallelism)
    moe_parallel.py  expert parallelism: the experts' all-to-all exchanges
    quant.py         bf16 / int8 decode weights and the QLoRA frozen base
    partitioning.py  each parameter's logical axes (Flax partitioning metadata)

The switch that picks among them is jaxformer/lowering.py; layers/dispatch.py calls the
attention paths. The room sits inside layers, not beside lowering.py, because the kernels run on
the layers' own mask and score records (layers/masks.py, layers/scores.py): one package with no
circle, where a sibling package would import layers and be imported by it.
"""
