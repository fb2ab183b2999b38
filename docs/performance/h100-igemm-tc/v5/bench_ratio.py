import json,math,sys
gm=lambda xs: math.exp(sum(map(math.log,xs))/len(xs))
for f in sys.argv[1:]:
    rep=json.load(open(f))
    print(f)
    per={d:[] for d in ('fwd','bwd-data','bwd-weight')}; dense={d:[] for d in per}
    for r in rep['rows']:
        res=r['results']
        cu=res.get('cuda',{}).get('directions',{}); cd=res.get('cudnn',{}).get('directions',{})
        alg=res.get('cuda',{}).get('plan',{}).get('algorithm')
        line=[]
        for d in per:
            if cu.get(d,{}).get('median_ms') and cd.get(d,{}).get('median_ms'):
                x=cd[d]['median_ms']/cu[d]['median_ms']; per[d].append(x); line.append(f"{x:.2f}")
                if alg=='igemm-tc': dense[d].append(x)
        print(' ', r['name'][:26].ljust(26), r['dtype'][:5], alg, ' '.join(line))
    print(' all rows:', {d:round(gm(v),3) for d,v in per.items()}, round(gm(sum(per.values(),[])),3))
    print(' igemm-tc rows:', {d:(round(gm(v),3),len(v)) for d,v in dense.items()}, round(gm(sum(dense.values(),[])),3))
