"""LoRA as gerbil-train --lora does it, in PyTorch: for make-train-refs.py and device/train-torch.py.

`add_lora(model, rank, alpha, targets, seed)` freezes the model and wraps every nn.Linear of a
decoder layer whose module name is in `targets` so it computes x W^T + (alpha / rank) (x A^T) B^T,
with B = 0 and A drawn as gerbil draws it (`gerbil_frontend_hf::adapter::init_values`: SplitMix64
from `seed`, over the A factors in the order of their PEFT names, uniform in +-1/sqrt(in), rounded
to f32). It returns the trained factors: every A, then every B.
"""

import torch

MASK = (1 << 64) - 1
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def init_values(state, count, bound):
    """gerbil's `adapter::init_values`: (new state, `count` values uniform in +-bound)."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        u = (z >> 11) / float(1 << 53)
        out.append((2.0 * u - 1.0) * bound)
    return state, out


class LoraLinear(torch.nn.Module):
    def __init__(self, base, a, b, scale):
        super().__init__()
        self.base, self.scale = base, scale
        self.lora_A = torch.nn.Parameter(a)
        self.lora_B = torch.nn.Parameter(b)

    def forward(self, x):
        f = torch.nn.functional
        return self.base(x) + self.scale * f.linear(f.linear(x, self.lora_A), self.lora_B)


def add_lora(model, rank, alpha, targets=DEFAULT_TARGETS, seed=0):
    """Freezes `model` and wraps its targeted projections; returns the factors, A's and B's."""
    for p in model.parameters():
        p.requires_grad_(False)
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:
            if name.rsplit(".", 1)[-1] in targets:
                found[f"base_model.model.{name}.lora_A.weight"] = (name, module)
    state, wrapped = seed, []
    for a_name in sorted(found):
        name, module = found[a_name]
        out, inp = module.weight.shape
        device = module.weight.device
        state, values = init_values(state, rank * inp, 1.0 / inp ** 0.5)
        a = torch.tensor(values, dtype=torch.float32, device=device).reshape(rank, inp)
        b = torch.zeros(out, rank, dtype=torch.float32, device=device)
        lora = LoraLinear(module, a, b, alpha / rank)
        parent, leaf = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), leaf, lora)
        wrapped.append(lora)
    return [m.lora_A for m in wrapped] + [m.lora_B for m in wrapped]
