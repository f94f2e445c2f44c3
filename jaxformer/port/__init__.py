"""`jaxformer port`: a torch module -> readable Flax NNX source, with parity proven.

    from jaxformer.port import port_source, from_torch
    source = port_source(torch_model, {"idx": idx_numpy})        # the file's text
    model = from_torch(torch_model, {"idx": idx_numpy}, check=True)  # the NNX module, weights loaded
    source = port_source(torch_model, inputs, layers="jaxformer")  # known modules as jaxformer's classes

trace.py exports the module (torch.export, free batch and sequence dims); graph.py rebuilds the
module calls from the flat graph; body.py writes each module's __call__ through the aten table
(ops.py) and the flax layers for known torch.nn modules (layers.py); with layers="jaxformer",
twins.py finds the modules with a jaxformer twin and traces each as one opaque op, and
twin_source.py writes its construction and call; emit.py assembles the classes (filetext.py the
header and what the file declares around them); verify.py shows the file runs; api.py loads the weights
(jaxformer.convert, through jaxformer.interop's names for torch.nn's twins) and runs the parity
harness."""
from jaxformer.port.api import PortResult, from_torch, load_torch_weights, port, port_source, state_map
from jaxformer.port.trace import PortError

__all__ = ["PortError", "PortResult", "from_torch", "load_torch_weights", "port", "port_source", "state_map"]
