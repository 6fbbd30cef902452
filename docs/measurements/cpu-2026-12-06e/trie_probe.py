"""Old against new looked-up tree builders in one process (this CPU, alone): ms a call, three rounds, then a check that
both give the same trees. Run from the repository root:

    git show 8d8eb48:adaptive_spec/trees/lookup.py > /tmp/lookup_old.py
    .venv/bin/python docs/measurements/cpu-2026-12-06e/trie_probe.py
"""

import importlib.util, sys, time, torch
spec = importlib.util.spec_from_file_location("old", "/tmp/lookup_old.py"); old = importlib.util.module_from_spec(spec); sys.modules["old"]=old; spec.loader.exec_module(old)
from adaptive_spec.trees import lookup as new
c = [[1,2,3,4,5,6,7,8],[1,2,9,10,11,12,13,14],[20,21,22,23,24,25,26,27]]
def t(f, n=1000):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return 1e3 * (time.perf_counter() - s) / n
for r in range(3):
    print("trie old %.3f new %.3f | chain old %.3f new %.3f | path old %.3f new %.3f" % (
      t(lambda: old.lookup_trie(c, 49152, 3, "cpu")), t(lambda: new.lookup_trie(c, 49152, 3, "cpu")),
      t(lambda: old.lookup_tree(c[0], 49152, "cpu")), t(lambda: new.lookup_tree(c[0], 49152, "cpu")),
      t(lambda: old.trie_with_path(c[1:], torch.arange(4), 49152, 3, "cpu")), t(lambda: new.trie_with_path(c[1:], torch.arange(4), 49152, 3, "cpu"))))
# equality
for cands in (c, c[:1], [], [[5]], [[1,2],[1,3],[4]]):
    a = old.lookup_trie(cands, 50, 3, "cpu"); b = new.lookup_trie(cands, 50, 3, "cpu")
    assert a.tokens == b.tokens and a.parents == b.parents and torch.equal(a.draft_probs, b.draft_probs)
    for name in ("tokens", "parents", "depths", "ancestors"):
        assert torch.equal(a._tensors[name, torch.device("cpu")], b._tensors[name, torch.device("cpu")]), name
    p = torch.tensor([7, 8, 9]); lv = torch.tensor([11])
    a = old.trie_with_path(cands, p, 50, 3, "cpu", lv); b = new.trie_with_path(cands, p, 50, 3, "cpu", lv)
    assert torch.equal(a.draft_probs, b.draft_probs) and a.parents == b.parents
    for name in ("tokens", "parents", "depths", "ancestors"):
        x, y = a._tensors[name, torch.device("cpu")], b._tensors[name, torch.device("cpu")]
        assert torch.equal(x, y) and x.dtype == y.dtype, name
print("equal")
