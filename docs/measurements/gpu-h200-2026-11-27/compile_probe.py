"""Compiled vs eager-captured passes of a SmolLM2-shaped Llama (random weights), via bench.passes.measure_passes."""
import json, logging, os, sys, time
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
from transformers import LlamaConfig, LlamaForCausalLM
from adaptive_spec.engine import SpecEngine
from adaptive_spec.bench.passes import measure_passes

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 30
out = os.environ.get("OUT", "/tmp/probe-out")
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
kw = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
          max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **kw)).eval()
draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **kw)).eval()
engine = SpecEngine(target, draft, device=device)
print("torch", torch.__version__, "device", engine.device, flush=True)
rows = []
for role_rows, draft_rows in (((1,), ()), ((4,), ()), ((), (1,)), ((16,), ())):
    t0 = time.perf_counter()
    got = measure_passes(engine, role_rows, draft_rows, context=256, repeats=10, progress=False, compiled=True)
    for r in got:
        r["job_s"] = time.perf_counter() - t0
        print(json.dumps(r), flush=True)
    rows += got
    with open(f"{out}/compile_probe.json", "w") as f:
        json.dump({"device": str(engine.device), "layers": layers, "rows": rows}, f, indent=1)
