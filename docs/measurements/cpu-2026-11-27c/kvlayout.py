import time, torch, statistics
from adaptive_spec.engine import static_cache as sc
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import default_prompts
new_init = sc.StaticKV.__init__
def old_init(self, layers, kv_heads, head_dim, capacity, dtype, device):
    self.capacity = int(capacity)
    shape = (1, kv_heads, self.capacity + sc.SCRATCH, head_dim)
    self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
    self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
    self.buffer = None
    self.rows = torch.zeros(0, dtype=torch.long, device=device); self.width = None
def old_move(self, committed, block_rows):
    if self.buffer is not None:
        return new_move(self, committed, block_rows)
    k = int(block_rows.numel())
    for buf in (*self.keys, *self.values):
        buf[:, :, committed : committed + k] = buf.index_select(2, block_rows)
new_move = sc.StaticKV.move
sc.StaticKV.move = old_move
engines = {}
for name in ("old", "new"):
    sc.StaticKV.__init__ = old_init if name == "old" else new_init
    engines[name] = load_engine("smollm2", None, "cpu", None)
    engines[name].generate(default_prompts()[1], max_new_tokens=4, temperature=0, seed=0)
p = default_prompts()[0]
res = {"old": [], "new": []}
for rnd in range(4):
    for name in ("old", "new"):
        e = engines[name]
        for plan in ("autoregressive", "eagle:6:48:6:4:wor/traversal"):
            t = time.perf_counter(); r = e.generate(p, max_new_tokens=24, temperature=0, plan=plan, seed=0)
            res[name].append((plan, (time.perf_counter() - t) / r.stats.steps * 1e3))
    print(rnd, res["old"][-2:], res["new"][-2:], flush=True)
for plan in ("autoregressive", "eagle:6:48:6:4:wor/traversal"):
    o = [v for p_, v in res["old"] if p_ == plan]; n = [v for p_, v in res["new"] if p_ == plan]
    print(plan, "old median %.1f ms/step, new %.1f" % (statistics.median(o), statistics.median(n)))
