import json, torch
from adaptive_spec.engine import SpecEngine
from adaptive_spec.files import read_prompts, render_prompt
eng = SpecEngine.from_pretrained("smollm2")
ranks = []
def log(tree, fed, target_probs, temperature, drawn=None):
    q = tree.draft_probs[0].float(); y = int(target_probs[0].argmax())
    ranks.append(int((q > q[y]).sum()))
eng.node_log = log
for p in read_prompts("adaptive_spec/zoo/smollm2/prompts.jsonl", None):
    eng.generate(render_prompt(eng.tokenizer, p), max_new_tokens=128, temperature=0, plan="chain:1/block")
n = len(ranks)
print(json.dumps({"steps": n, **{f"top{k}": sum(r < k for r in ranks) / n for k in (1, 2, 3, 4)}}))
