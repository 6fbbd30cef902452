import torch, time, math, statistics
from torch.nn import functional
RING=32<<20
def run(out, inp, sizes=(1,2,3,4,8,16,32), reps=5):
    out=min(out,4096)
    count=min(16,max(1,math.ceil(RING/(out*inp*4))))
    gen=torch.Generator().manual_seed(0)
    row=[torch.randn(out,inp,generator=gen) for _ in range(count)]
    col=[w.t().contiguous().t() for w in row]
    pk=[torch.ops.mkldnn._reorder_linear_weight(w,1) for w in row]
    fns={'row':lambda x,i: functional.linear(x,row[i]), 'col':lambda x,i: functional.linear(x,col[i]),
         'packed':lambda x,i: torch.ops.mkldnn._linear_pointwise(x,pk[i],None,"none",[],"")}
    res={k:{n:[] for n in sizes} for k in fns}
    xs={n:torch.randn(n,inp,generator=gen) for n in sizes}
    with torch.inference_mode():
        for rep in range(1+reps):
            for n in sizes:
                for k,f in fns.items():
                    t=time.perf_counter()
                    for i in range(count): f(xs[n],i)
                    if rep: res[k][n].append((time.perf_counter()-t)*1e3/count)
    print(f"{out}x{inp}")
    for k in fns: print("  %-7s"%k, " ".join("%6.3f"%statistics.median(res[k][n]) for n in sizes))
for s in [(576,576),(192,576),(1536,576),(576,1536),(49152,576)]: run(*s)
