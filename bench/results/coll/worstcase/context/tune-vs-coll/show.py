#!/usr/bin/env python3
"""rec's time over direct's, per round, in bench tune (its all-ranks block)
and in bench coll, at each size: show.py DIR ROUNDS"""
import json,sys,statistics as st
d=sys.argv[1]; K=int(sys.argv[2])
res={}
for k in range(1,K+1):
    txt=open(f'{d}/tune.r{k}.txt').read().split('# all ranks')[1].split('\n\n')[0]
    for line in txt.splitlines()[2:]:
        f=line.split()
        if f[0] in('allgather','reduce_scatter'):
            f=[x for x in f if x not in ("->","pick")]; t=dict(zip(f[8::2],map(float,f[9::2])))
            res.setdefault((f[0],int(f[1]),'tune'),[]).append(t['rec']/t['direct'])
    rows=[json.loads(l) for l in open(f'{d}/a.r{k}.jsonl')]
    for c in ('allgather','reduce_scatter'):
        for s in (4096,16384,65536):
            t={r['algo']:r['oop_us'] for r in rows if r['coll']==c and r['size']==s}
            res.setdefault((c,s,'coll'),[]).append(t['rec']/t['direct'])
for k,v in sorted(res.items()):
    print(k,' '.join(f'{x:.2f}' for x in v),' median %.2f'%st.median(v))
