import time, torch
from adaptive_spec.engine.layout import _Copy
w = torch.nn.Parameter(torch.randn(576, 576))
c = _Copy("column"); c.of(w)
n = 200000
t = time.perf_counter()
for _ in range(n):
    c.of(w)
dt = (time.perf_counter() - t) / n
print(f"_Copy.of: {dt*1e6:.3f} us a call; SmolLM2 has 30*7+1 = 211 linears: {dt*211*1e3:.3f} ms a pass")
