"""The trained weights back in the user's own torch module: strict, every key (the tied head under
both of its names, the causal-mask buffers), then one greedy continuation of "def "."""
import torch
from my_gpt import make_gpt
from safetensors.torch import load_file

model = make_gpt().eval()
model.load_state_dict(load_file("my_gpt_trained.safetensors"), strict=True)
ids = torch.tensor([list(b"def ")]) + 3  # jaxformer's byte ids: 0 pad, 1 bos, 2 eos, then bytes + 3
with torch.no_grad():
    for _ in range(8):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
print(bytes((ids[0] - 3).clamp(0, 255).tolist()))
