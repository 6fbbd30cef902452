"""SmolLM2's target forward, ms by rows: the column-major copy read as a buffer made once (before this session's
change) against the copy held by `_Copy` and checked against its weight on every call (now), interleaved in one
process (`adaptive_spec.bench.profile.measure.measure_forwards`, context 128), this host's cached weight forms.
Alone on the machine, from the repository root:

    TOKENS=1,2,4 [SWAP=1] python docs/measurements/cpu-2026-12-06g/forward_ab.py REPEATS OUT.json

The "before" model is a deep copy of the loaded target; SWAP=1 gives the copy to "now" instead, to see what the
copy's placement in memory alone does.
"""
import copy, json, os, sys
import torch
from torch.nn import functional
from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.layout import PerSizeLinear, packed_linear
from adaptive_spec.bench.profile.measure import measure_forwards
import adaptive_spec.engine.weight_order as wo


class BufferCopy(PerSizeLinear):
    """The forward before: the column-major copy a buffer, never checked against the weight."""

    def forward(self, x):
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        form = self.row_forms[rows] if rows < len(self.row_forms) else self.form_above
        if form == "row" or torch.is_grad_enabled() or self.weight.device.type != "cpu":
            return functional.linear(x, self.weight, self.bias)
        if form == "column":
            return functional.linear(x, self.weight_column_major, self.bias)
        if x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return functional.linear(x, self.weight, self.bias)
        return packed_linear(x, self.packed_weight.of(self.weight), self.bias)


new = SpecEngine.from_pretrained("smollm2")
old_target, now_target = copy.deepcopy(new.target), new.target
if os.environ.get("SWAP") == "1":
    old_target, now_target = now_target, old_target
n = 0
for m in old_target.modules():
    if type(m) is PerSizeLinear:
        if m.column_weight is not None:
            m.register_buffer("weight_column_major", m.column_weight.of(m.weight), persistent=False)
            n += 1
        m.__class__ = BufferCopy
print("layers with a column-major copy:", n)
tokens = [int(t) for t in os.environ.get("TOKENS", "1,2,4").split(",")]
out = measure_forwards(old_target, new.draft, contexts=[128], tokens=tokens, warmup=2,
                       repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 10, also={"now": now_target}, progress=False)
rows = [{"rows": k, "before_ms": out["target_ms"][0][i], "now_ms": out["now_ms"][0][i]} for i, k in enumerate(tokens)]
for r in rows:
    print(r["rows"], "before %.2f now %.2f ratio %.3f" % (r["before_ms"], r["now_ms"], r["now_ms"] / r["before_ms"]))
json.dump({"context": 128, "cpu": wo.cpu_name(), "threads": torch.get_num_threads(), "layers_with_column_copy": n, "swap": os.environ.get("SWAP") == "1",
           "rows": rows, "raw": out}, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/s31/fwd_ab.json", "w"), indent=1)
