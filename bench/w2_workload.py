"""The "W2" notebook of issue 11, as code both the benchmark's kernel and its raw-path process run:
a Llama-architecture model of about 2.7 B parameters (bf16, random weights) on cuda:0, the KV cache
of a 2048-token prompt kept in a variable, 64 greedy tokens generated, a 4 GiB temporary allocated
and freed (the allocator keeps it cached). The CPU variant: about 2 GB of numpy and pandas.

``SETUP`` builds the state, ``CELL`` is the cell a returning user runs (it prints a digest that must
not change across a suspend), ``TOKENS`` names the reference result.
"""
from __future__ import annotations

GPU_SETUP = """
import hashlib, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=2560, intermediate_size=6912, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda:0"):
    model = LlamaForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
prompt = torch.randint(0, cfg.vocab_size, (1, 2048), device="cuda:0", generator=torch.Generator("cuda:0").manual_seed(1))
with torch.no_grad():
    kv = model(prompt, use_cache=True).past_key_values
tmp = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:0"); tmp.fill_(1); del tmp
params = sum(p.numel() for p in model.parameters())
"""
GPU_CELL = """
with torch.no_grad():
    out = model.generate(prompt[:, :16], max_new_tokens=64, min_new_tokens=64, do_sample=False)
print(hashlib.sha256(str(out[0, -64:].tolist()).encode()).hexdigest()[:16])
"""

# The W2 model's layers; others (bench_fork's --model-gb) change only their number, at about
# 0.16 GB each beside 0.33 GB of embeddings and head.
W2_LAYERS = 32
LAYER_BYTES, BASE_BYTES = 158_597_120, 327_680_000


def gpu_setup(layers: int = W2_LAYERS) -> str:
    """W2's setup with ``layers`` decoder layers instead of 32."""
    return GPU_SETUP.replace(f"num_hidden_layers={W2_LAYERS}", f"num_hidden_layers={layers}")


def layers_for(gigabytes: float) -> int:
    """How many layers make the model about ``gigabytes`` GB of bf16 weights."""
    return max(1, round((gigabytes * 1e9 - BASE_BYTES) / LAYER_BYTES))


CPU_SETUP = """
import hashlib, numpy as np, pandas as pd
rng = np.random.default_rng(0)
arrays = [rng.random(32 << 20) for _ in range(6)]                 # 1.5 GiB of float64
frame = pd.DataFrame({"a": rng.integers(0, 1000, 8 << 20), "b": rng.random(8 << 20)})   # 128 MiB
scratch = np.ones(1 << 28, dtype=np.uint8); del scratch            # freed: malloc may keep it
"""
CPU_CELL = """
print(hashlib.sha256(b"".join(a[:1000].tobytes() for a in arrays) + frame.groupby("a").b.sum().values.tobytes()).hexdigest()[:16])
"""


# Fidelity across a restore onto another GPU: the tokens, every parameter and the KV cache bit for
# bit, an optimizer's state after a step, and which GPU the process believes it is on (PyTorch's
# cached device properties against the driver asked afresh).
GPU_FIDELITY_SETUP = """
opt_model = torch.nn.Linear(1024, 1024, device="cuda:0")
opt = torch.optim.AdamW(opt_model.parameters(), lr=1e-3)
opt_model(torch.ones(8, 1024, device="cuda:0")).square().sum().backward(); opt.step()
"""
GPU_FIDELITY_CELL = """
import json
from gpucr_hooks.gpu_ids import device_uuid
def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]
print(json.dumps({
    "params": _digest(list(model.parameters())),
    "kv": _digest([t for layer in kv.layers for t in (layer.keys, layer.values)] if hasattr(kv, "layers") else [t for pair in kv for t in pair]),
    "optimizer": _digest([v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)] + list(opt_model.parameters())),
    "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
    "driver_uuid": device_uuid(0),
}))
"""


def cpu_setup(arrays: int = 6) -> str:
    """The CPU variant with ``arrays`` arrays of 256 MiB instead of 6 (a smaller state for a slow
    store on a small machine)."""
    return CPU_SETUP.replace("for _ in range(6)", f"for _ in range({arrays})")


def code(kind: str) -> tuple[str, str]:
    return (GPU_SETUP, GPU_CELL) if kind == "gpu" else (CPU_SETUP, CPU_CELL)
