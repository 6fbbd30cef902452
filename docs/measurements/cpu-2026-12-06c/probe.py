"""Σ min(p, q_s) at T = 1, teacher-forced on the target's answers to the 12 demo prompts (128 tokens each), for the
head's rows at scales s (its logits / s).

Usage: python probe.py OUT.json greedy   (the target's greedy answers: probe_greedy_text.json)
       python probe.py OUT.json sampled  (answers it samples at T = 1, seed 0: probe_t1_text.json)
"""

import json
import sys

import torch
from transformers import AutoTokenizer

from adaptive_spec.engine.models import fetch_model, shipped_drafts_dir
from adaptive_spec.engine.pretrained import load_causal_lm
from adaptive_spec.zoo.drafts import _sequences, shift_right, shipped_drafts
from adaptive_spec.zoo.online import answer_shard
from adaptive_spec.zoo.user_prompts import demo_prompts

out, text = sys.argv[1], sys.argv[2]
torch.set_grad_enabled(False)
d = fetch_model("smollm2")
tok = AutoTokenizer.from_pretrained(d)
target = load_causal_lm(d, "target", dtype=torch.float32).eval()
head, _ = shipped_drafts(target, shipped_drafts_dir("smollm2"))
head.eval()
if text == "sampled":  # answer_shard's generate call, sampling at T = 1 instead
    orig = target.generate
    torch.manual_seed(0)
    target.generate = lambda **kw: orig(**{**kw, "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0})
shard = answer_shard(target, tok, demo_prompts("smollm2"), 128)
scales = [0.3, 0.5, 0.7, 0.85, 1.0, 1.2]
acc = dict.fromkeys(scales, 0.0)
n = 0
for dd, s, e, a in _sequences([shard]):
    ids = dd["ids"][s:e].long()[None]
    h = target.model(input_ids=ids).last_hidden_state
    p = torch.softmax(target.lm_head(h).float(), -1)[0]
    rows = slice(max(a - 1 - s, 0), e - s - 1)
    logits, _ = head(ids, shift_right(h).to(head.dtype), torch.arange(ids.shape[1])[None], None, None)
    pr = p[rows]
    for t in scales:
        q = torch.zeros_like(p)
        q[:, head.token_ids] = torch.softmax(logits[0].float() / t, -1)
        acc[t] += float(torch.minimum(pr, q[rows]).sum())
    n += pr.shape[0]
res = {"text": text, "positions": n, "sum_min_p_q_by_scale": {str(t): round(v / n, 4) for t, v in acc.items()}}
print(res)
with open(out, "w") as f:
    json.dump(res, f, indent=2)
