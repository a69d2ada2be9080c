#!/bin/sh
# `fourfold bench` in CI: coll's built-in check finds no wrong element (fp32
# and bf16 wire, every algorithm, in and out of place, 2 pretended nodes of 2
# ranks); profile writes one valid JSON file atomically (no temporary file
# left) with every key the planner requires, which the planner's reader and
# the collective layer (FF_PROFILE) accept; tune adds measured picks to a
# profile without touching the rest, and a tuned profile round-trips through
# the profile module (tune --rewrite: load -> write -> load, the same values,
# picks included); gemm prints its table. Speed is never checked.
#   usage: bench_check.sh FOURFOLD MPIEXEC
set -eu
FF=$1 MPIEXEC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL $*"; exit 1; }

for wire in fp32 bf16; do
    FF_RANKS_PER_NODE=2 "$MPIEXEC" -np 4 "$FF" bench coll -b 4K -e 64K -f 16 -n 2 -w 1 \
        --wire $wire --json "$WORK/coll.jsonl" > "$WORK/coll_$wire.txt" 2>&1 ||
        { cat "$WORK/coll_$wire.txt"; fail "bench coll --wire $wire exited non-zero"; }
    grep -q "^# total #wrong: 0$" "$WORK/coll_$wire.txt" || fail "bench coll $wire: #wrong"
    for algo in ring rec rec-whole direct hier-ring hier-rec auto; do
        grep -q " $algo" "$WORK/coll_$wire.txt" || fail "bench coll $wire: no row for $algo"
    done
    echo "ok   bench coll --wire $wire: every algorithm, #wrong 0"
done
python3 - "$WORK/coll.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
colls = {r["coll"] for r in rows}
assert colls == {"allgather", "reduce_scatter", "allreduce", "alltoall"}, colls
assert all(r["oop_wrong"] == 0 and r["ip_wrong"] <= 0 for r in rows)
assert all(r["nodes"] == 2 and r["per_node"] == 2 for r in rows)
print(f"ok   {len(rows)} JSON rows, all four collectives, none wrong")
PY

# the profile, with the inter-node level pretended (nodes of one rank) and
# with two ranks on one node
for k in 1 2; do
    out="$WORK/p$k.json"
    FF_RANKS_PER_NODE=$k "$MPIEXEC" -np 2 "$FF" bench profile --quick --name "ci k=$k" \
        --out "$out" > "$WORK/profile$k.txt" 2>&1 ||
        { cat "$WORK/profile$k.txt"; fail "bench profile exited non-zero"; }
    grep -q "residual" "$WORK/profile$k.txt" || fail "bench profile printed no residuals"
    python3 - "$out" "$k" <<'PY'
import json, math, sys
p = json.load(open(sys.argv[1]))
k = int(sys.argv[2])
need = {"format": str, "version": int, "name": str, "ranks_per_node": int,
        "memory_bytes": (int, float), "gemm_flops": (int, float), "peak_flops": (int, float),
        "alpha_intra_s": (int, float), "beta_intra_Bps": (int, float),
        "alpha_inter_s": (int, float), "beta_inter_Bps": (int, float), "intra_bw": list,
        "reduce_Bps": (int, float)}
for key, t in need.items():
    assert key in p and isinstance(p[key], t), f"key {key}: {p.get(key)!r}"
assert p["format"] == "fourfold-profile" and p["version"] == 1
assert p["ranks_per_node"] == k, p["ranks_per_node"]
# reduce_Bps is timed, not fitted: never 0 (unresolved)
for key in ("memory_bytes", "gemm_flops", "peak_flops", "beta_intra_Bps", "beta_inter_Bps",
            "reduce_Bps"):
    assert p[key] > 0 and math.isfinite(p[key]), key
assert p["alpha_intra_s"] >= 0 and p["alpha_inter_s"] >= 0
# the GEMM curve fitted to the measured shapes (gemm_call_s only when > 0)
assert 0 <= p["gemm_half_dim"] <= 2000 and 0 <= p.get("gemm_call_s", 0) <= 30e-6, p
assert p["fit"]["gemm"]["shapes"] == 9 and p["fit"]["gemm"]["max_rel"] >= 0, p["fit"]
if k == 2:
    assert [(e["inner"], e["size"]) for e in p["intra_bw"]] == [(1, 2)], p["intra_bw"]
    assert p["intra_bw"][0]["Bps"] > 0 and p["fit"]["intra"]["measured"] is True
else:
    assert p["intra_bw"] == [] and p["fit"]["inter"]["measured"] is True
print(f"ok   profile (nodes of {k}): {p['name']}, alpha/beta intra {p['alpha_intra_s']:.3g}/"
      f"{p['beta_intra_Bps']:.3g}, inter {p['alpha_inter_s']:.3g}/{p['beta_inter_Bps']:.3g}, "
      f"additions {p['reduce_Bps']:.3g} B/s")
PY
done
leftover=$(ls "$WORK" | grep -c tmp || true)
[ "$leftover" = 0 ] || fail "temporary files left: $(ls "$WORK")"

# the collective layer reads it (FF_PROFILE), and refuses a broken one
FF_PROFILE="$WORK/p1.json" "$MPIEXEC" -np 2 "$FF" bench coll --colls ar -b 4K -e 4K -n 1 -w 0 \
    > "$WORK/with_profile.txt" 2>&1 || { cat "$WORK/with_profile.txt"; fail "FF_PROFILE run"; }
echo '{"format":"fourfold-profile","alpha_intra_s":"x"}' > "$WORK/bad.json"
if FF_PROFILE="$WORK/bad.json" "$MPIEXEC" -np 2 "$FF" bench coll --colls ar -b 4K -e 4K -n 1 \
    > "$WORK/bad.txt" 2>&1; then fail "a broken FF_PROFILE was accepted"; fi
grep -q "FF_PROFILE: .*alpha_intra_s" "$WORK/bad.txt" || { cat "$WORK/bad.txt"; fail "message"; }
echo "ok   FF_PROFILE read by the collective layer; a broken one refused with a message"

# bench tune: adds measured picks to a profile, keeps everything else, and
# replaces (never duplicates) the picks when run again; the collective
# layer and the planner read the result
cp "$WORK/p2.json" "$WORK/t.json"
tune() { FF_RANKS_PER_NODE=2 "$MPIEXEC" -np 4 "$FF" bench tune -b 4K -e 64K -n 2 --repeats 1 "$@"; }
tune --profile "$WORK/t.json" --margin 0 --repeats 2 > "$WORK/tune.txt" 2>&1 ||
    { cat "$WORK/tune.txt"; fail "bench tune exited non-zero"; }
grep -q "measured pick(s) written to $WORK/t.json" "$WORK/tune.txt" || fail "bench tune output"
grep -q "; median of 2 repeat(s)$" "$WORK/tune.txt" || fail "bench tune --repeats 2 not applied"
tune --profile "$WORK/t.json" --out "$WORK/t2.json" > "$WORK/tune2.txt" 2>&1 ||
    { cat "$WORK/tune2.txt"; fail "bench tune (again) exited non-zero"; }
python3 - "$WORK/p2.json" "$WORK/t.json" "$WORK/t2.json" <<'PY'
import json, sys
base, tuned, again = (json.load(open(f)) for f in sys.argv[1:4])
for f in sys.argv[2:4]:
    n = open(f).read().count('"picks"')
    assert n == 1, f"{f}: {n} picks keys"
for t in (tuned, again):
    assert {k: v for k, v in t.items() if k != "picks"} == base, "other keys changed"
    assert isinstance(t["picks"], list)
    for q in t["picks"]:
        assert q["coll"] in ("allgather", "reduce_scatter", "allreduce"), q
        assert q["algo"] in ("ring", "rec", "rec-whole", "direct", "hier-ring", "hier-rec"), q
        assert (q["nodes"], q["per_node"]) in ((2, 2), (1, 2), (2, 1)), q
        assert 0 <= q["min_B"] < q["max_B"] <= 65536, q
        assert q["algo"] != q["model_algo"], q
print(f"ok   bench tune: {len(tuned['picks'])} and {len(again['picks'])} picks (margin 0, then "
      f"0.1), every other key kept, one picks list")
PY
# picks as the first member, spaced, with brackets in a string of a pick,
# and a "picks" string value: still one valid object after tuning again
python3 - "$WORK/t.json" "$WORK/t3.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
hand = {"coll": "allreduce", "nodes": 2, "per_node": 2, "min_B": 1, "max_B": 2, "algo": "ring",
        "note": "a ] b [[ c ]"}
q = {"picks": p.pop("picks") + [hand], **p, "name": "picks"}
open(sys.argv[2], "w").write(json.dumps(q, indent=1))
PY
tune --profile "$WORK/t3.json" -e 16K > "$WORK/tune3.txt" 2>&1 ||
    { cat "$WORK/tune3.txt"; fail "bench tune of a profile with picks first exited non-zero"; }
python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); assert p["name"] == "picks" and isinstance(p["picks"], list) and open(sys.argv[1]).read().count("\"picks\":") == 1' "$WORK/t3.json" ||
    { cat "$WORK/t3.json"; fail "re-tuned profile with picks first is not valid"; }
echo "ok   bench tune replaces picks that come first in the profile, brackets in their strings"
# the round trip: the tuned profile with both regimes, two more picks (one
# without the informational keys), a non-integer size and an unknown key,
# written by python (indented), rewritten by the profile module twice: the
# same values as python wrote, picks included; the second text the same as
# the first; the collective layer's predictions and choices the same from both
python3 - "$WORK/t.json" "$WORK/rt.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p.update(small_max_intra_B=2048, alpha_intra_small_s=1.5e-6, beta_intra_small_Bps=2.5e9,
         small_max_inter_B=16384, alpha_inter_small_s=3e-5, beta_inter_small_Bps=6e8,
         future_key={"kept": [1, 2.5, None, "x"]})
p["picks"] = p.get("picks", []) + [
    {"coll": "allgather", "nodes": 2, "per_node": 2, "min_B": 65536, "max_B": 11585237.502960395,
     "algo": "hier-rec", "model_algo": "ring", "sizes": 2},
    {"coll": "reduce_scatter", "nodes": 2, "per_node": 1, "min_B": 0, "max_B": 1e15,
     "algo": "direct"}]
open(sys.argv[2], "w").write(json.dumps(p, indent=1))
PY
rewrite() { "$MPIEXEC" -np 1 "$FF" bench tune --rewrite --profile "$1" --out "$2"; }
rewrite "$WORK/rt.json" "$WORK/rt1.json" > "$WORK/rt.txt" 2>&1 &&
    rewrite "$WORK/rt1.json" "$WORK/rt2.json" >> "$WORK/rt.txt" 2>&1 ||
    { cat "$WORK/rt.txt"; fail "bench tune --rewrite exited non-zero"; }
grep -q "profile with [0-9]* pick(s) written to $WORK/rt1.json" "$WORK/rt.txt" ||
    { cat "$WORK/rt.txt"; fail "bench tune --rewrite output"; }
cmp -s "$WORK/rt1.json" "$WORK/rt2.json" ||
    { diff "$WORK/rt1.json" "$WORK/rt2.json"; fail "a rewritten profile changed when rewritten"; }
python3 - "$WORK/rt.json" "$WORK/rt1.json" <<'PY'
import json, sys
wrote, back = (json.load(open(f)) for f in sys.argv[1:3])
assert back == wrote, {k: (wrote.get(k), back.get(k)) for k in set(wrote) | set(back)
                       if wrote.get(k) != back.get(k)}
assert len(back["picks"]) >= 2 and back["fit"] == wrote["fit"]
print(f"ok   round trip: a tuned profile with {len(back['picks'])} picks, both regimes, fit and "
      f"an unknown key reads back with the same values; a second rewrite is the same text")
PY
for f in rt rt1; do
    FF_RANKS_PER_NODE=2 FF_PROFILE="$WORK/$f.json" "$MPIEXEC" -np 4 "$FF" bench coll -b 4K -e 64K \
        -f 16 -n 1 -w 0 --place out > "$WORK/$f.coll" 2>&1 || { cat "$WORK/$f.coll"; fail "$f coll"; }
    awk '!/^#/ && NF > 6 { print $1, $5, $6 }' "$WORK/$f.coll" > "$WORK/$f.pred"
done
[ -s "$WORK/rt.pred" ] && cmp -s "$WORK/rt.pred" "$WORK/rt1.pred" ||
    { diff "$WORK/rt.pred" "$WORK/rt1.pred"; fail "FF_PROFILE: other predictions after a rewrite"; }
if rewrite "$WORK/regime_bad_rt.json" "$WORK/rt3.json" > "$WORK/rt_bad.txt" 2>&1; then
    fail "bench tune --rewrite of a missing profile succeeded"; fi
[ "$(grep -c "error: cannot open profile" "$WORK/rt_bad.txt")" = 1 ] && [ ! -e "$WORK/rt3.json" ] ||
    { cat "$WORK/rt_bad.txt"; fail "bench tune --rewrite of a missing profile: not one message"; }
echo "ok   FF_PROFILE gives the same predictions and choices before and after the rewrite"
FF_RANKS_PER_NODE=2 FF_PROFILE="$WORK/t.json" "$MPIEXEC" -np 4 "$FF" bench coll -b 4K -e 64K \
    -f 16 -n 1 -w 0 --place out > "$WORK/tuned_coll.txt" 2>&1 ||
    { cat "$WORK/tuned_coll.txt"; fail "bench coll with a tuned FF_PROFILE"; }
grep -q "^# total #wrong: 0$" "$WORK/tuned_coll.txt" || fail "bench coll, tuned profile: #wrong"
"$FF" plan --machine "$WORK/t.json" --print-machine > "$WORK/tuned_plan.txt" 2>&1 ||
    { cat "$WORK/tuned_plan.txt"; fail "the planner refused a tuned profile"; }
echo "ok   a tuned profile is read by the collective layer and the planner"
# --history: two jobs append their times to one file and the second decides
# on both; times planted in a history (ring 1 us, everything else 1 s, in
# 5 jobs of this shape; the opposite in jobs of another shape, which must not
# count) make ring the fastest at every size of the 4-rank layout; times
# planted where the median and the worst case disagree (rec 2 us, ring 1 us
# in 4 jobs, and rec 1 us, ring 0.1 s in a fifth; the rest 1 s) make rec the
# choice, which a median of the times would not; and the 90th percentile
# over 20 jobs is their third largest (ring 0.1 s in 2 jobs of 19 planted,
# rec 0.1 ms in the rest, ring chosen); a job that did not time every
# algorithm does not count, nor does an algorithm's second line with one
# time make one job of two; a job's time follows the file's latest
tune --profile "$WORK/t.json" --out "$WORK/h1.json" --history "$WORK/h.jsonl" > "$WORK/h1.txt" 2>&1 ||
    { cat "$WORK/h1.txt"; fail "bench tune --history (new file) exited non-zero"; }
n1=$(wc -l < "$WORK/h.jsonl")
tune --profile "$WORK/t.json" --out "$WORK/h1.json" --history "$WORK/h.jsonl" > "$WORK/h2.txt" 2>&1 ||
    { cat "$WORK/h2.txt"; fail "bench tune --history (again) exited non-zero"; }
[ "$n1" -gt 0 ] && [ "$(wc -l < "$WORK/h.jsonl")" = $((2 * n1)) ] ||
    fail "bench tune --history: $n1 lines after one job, $(wc -l < "$WORK/h.jsonl") after two"
python3 - "$WORK/h.jsonl" "$WORK/h2.txt" "$WORK" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert all(r["job"] == "2x2" and r["us"] > 0 for r in recs), recs[0]
rows = [l.split() for l in open(sys.argv[2]) if l.startswith(" ")]
assert rows and all(r[7] == "2" for r in rows), "jobs column after two jobs"
keys = {(r["nodes"], r["per_node"], r["coll"], r["bytes"], r["algo"]) for r in recs}
def line(job, k, us, time):
    return json.dumps(dict(job=job, nodes=k[0], per_node=k[1], coll=k[2], bytes=k[3], algo=k[4],
                           us=us, time=time), separators=(",", ":")) + "\n"
with open(sys.argv[3] + "/planted.jsonl", "w") as f:
    for job, fast, t0 in (("2x2", 1.0, 1), ("1x4", 1e6, 6)):
        for j in range(5):  # a job's lines together, as tune writes them
            for k in sorted(keys):
                f.write(line(job, k, fast if k[4] == "ring" else 1e6 / fast, t0 + j))
with open(sys.argv[3] + "/worst.jsonl", "w") as f:
    for j in range(5):
        for k in sorted(keys):
            us = {"ring": 1.0 if j < 4 else 1e5, "rec": 2.0 if j < 4 else 1.0}.get(k[4], 1e6)
            f.write(line("2x2", k, us, 1 + j))
with open(sys.argv[3] + "/pct.jsonl", "w") as f:
    for j in range(19):  # two jobs at time 9; the last at 4e9
        for k in sorted(keys):
            us = {"ring": 1.0 if j > 1 else 1e5, "rec": 100.0 if j > 1 else 1.0}.get(k[4], 1e6)
            f.write(line("2x2", k, us, 4000000000 if j == 18 else 9 if j in (8, 9) else 1 + j))
    for k in sorted(keys):  # a job without rec: ring 0.1 s, which would be its third bad job
        if k[4] != "rec":
            f.write(line("2x2", k, 1e5 if k[4] == "ring" else 1e6, 100))
print(f"ok   bench tune --history: {len(recs)} lines from two jobs, the second's medians over 2")
PY
tune --profile "$WORK/t.json" --out "$WORK/h3.json" --history "$WORK/planted.jsonl" \
    > "$WORK/h3.txt" 2>&1 || { cat "$WORK/h3.txt"; fail "bench tune, planted history"; }
tune --profile "$WORK/t.json" --out "$WORK/h4.json" --history "$WORK/worst.jsonl" \
    > "$WORK/h4.txt" 2>&1 || { cat "$WORK/h4.txt"; fail "bench tune, planted worst cases"; }
tune --profile "$WORK/t.json" --out "$WORK/h5.json" --history "$WORK/pct.jsonl" \
    > "$WORK/h5.txt" 2>&1 || { cat "$WORK/h5.txt"; fail "bench tune, planted 90th percentile"; }
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]


def decided(name):
    """The 4-rank layout's rows of tune's table, and its picks."""
    sect, rows = None, []
    for l in open(f"{work}/{name}.txt"):
        if l.startswith("# all ranks"):
            sect = "all"
        elif l.startswith("# "):
            sect = None
        elif l.startswith(" ") and sect == "all":
            rows.append(l.split())
    assert rows, f"{name}: no rows for the 4-rank layout"
    picks = [q for q in json.load(open(f"{work}/{name}.json"))["picks"]
             if (q["nodes"], q["per_node"]) == (2, 2)]
    return rows, picks


rows, picks = decided("h3")
for r in rows:  # the medians are the planted times: 1 us for ring, 1 s for the rest
    assert r[3] == "ring" and r[5] == "1.0" and r[7] == "6", r
    assert r[4] == ("1.0" if r[2] == "ring" else "1000000.0"), r
    assert (r[-1] == "pick") == (r[2] != "ring"), r
assert all(q["algo"] == "ring" for q in picks), picks
want = sum(r[2] != "ring" for r in rows)
assert sum(q["sizes"] for q in picks) == want, (picks, want)
recs = [json.loads(l) for l in open(f"{work}/planted.jsonl")]
mine = [r for r in recs if r["time"] > 10]  # planted: jobs 1-10
assert mine and all(r["us"] not in (1.0, 1e6) for r in mine), "appended a median, not its own time"
assert len({r["time"] for r in mine}) == 1, "this job's lines do not share one time"
assert len(recs) - len(mine) == 10 * len(mine), "a planted line lost, or a line of this job"
print(f"ok   a planted history decides: ring fastest at all {len(rows)} sizes of the 4-rank layout, "
      f"{want} picked; jobs of another shape ignored; the job's own times appended")
rows, picks = decided("h4")
for r in rows:  # ring's median is 1 us, rec's 2 us; ring is 1e5 times the fastest in one job
    times = dict(zip(r[8::2], r[9::2]))
    assert r[3] == "rec" and r[7] == "6", r
    assert times["ring"] == "1.0" and times["rec"] == "2.0" and r[5] == "2.0", r
    assert (r[2] != "ring") or float(r[6]) >= 1e4, r  # the model's worst case, when it is ring
    assert (r[-1] == "pick") == (r[2] != "rec"), r
assert all(q["algo"] == "rec" for q in picks), picks
assert sum(q["sizes"] for q in picks) == sum(r[2] != "rec" for r in rows), picks
print(f"ok   the worst case over jobs decides: rec at all {len(rows)} sizes of the 4-rank layout, "
      f"though ring's median is half rec's")
rows, picks = decided("h5")
for r in rows:  # ring 1e5 times the fastest in 2 of 20 jobs: its 90th percentile is not that
    assert r[3] == "ring" and r[7] == "20", r
    assert (r[-1] == "pick") == (r[2] != "ring"), r
assert all(q["algo"] == "ring" for q in picks), picks
assert sum(q["sizes"] for q in picks) == sum(r[2] != "ring" for r in rows), picks
times = {json.loads(l)["time"] for l in open(f"{work}/pct.jsonl")}
assert max(times) == 4000000001, "this job's time is not one more than the file's latest"
print(f"ok   the 90th percentile of 20 jobs is their third largest (ring at all {len(rows)} sizes); "
      f"a job without every algorithm left out, two jobs of one time told apart, a later time")
PY
# bad input: one message, non-zero exit
if tune > "$WORK/tune_bad.txt" 2>&1; then fail "bench tune without --profile succeeded"; fi
grep -q "profile FILE is required" "$WORK/tune_bad.txt" || { cat "$WORK/tune_bad.txt"; fail "msg"; }
if tune --profile "$WORK/missing.json" > "$WORK/tune_bad.txt" 2>&1; then
    fail "bench tune of a missing profile succeeded"; fi
[ "$(grep -c "error: cannot open profile $WORK/missing.json" "$WORK/tune_bad.txt")" = 1 ] ||
    { cat "$WORK/tune_bad.txt"; fail "missing profile: not one message"; }
if FF_ALGO=ring tune --profile "$WORK/t.json" > "$WORK/tune_bad.txt" 2>&1; then
    fail "bench tune with FF_ALGO=ring succeeded"; fi
grep -q "FF_ALGO=ring forces" "$WORK/tune_bad.txt" || { cat "$WORK/tune_bad.txt"; fail "msg"; }
if tune --profile "$WORK/t.json" --repeats 0 > "$WORK/tune_bad.txt" 2>&1; then
    fail "bench tune --repeats 0 succeeded"; fi
[ "$(grep -c "repeats" "$WORK/tune_bad.txt")" = 1 ] ||
    { cat "$WORK/tune_bad.txt"; fail "--repeats 0: not one message"; }
# a history line this command did not write: one message naming the line;
# the profile and the history are left as they were
cp "$WORK/h.jsonl" "$WORK/bad.jsonl"
sed -i '3s/"us":/"us":x/' "$WORK/bad.jsonl"
cp "$WORK/bad.jsonl" "$WORK/bad.keep"
cp "$WORK/t.json" "$WORK/t.keep"
if tune --profile "$WORK/t.json" --history "$WORK/bad.jsonl" > "$WORK/tune_bad.txt" 2>&1; then
    fail "bench tune with a corrupt history succeeded"; fi
[ "$(grep -c "error: --history $WORK/bad.jsonl, line 3: not a line" "$WORK/tune_bad.txt")" = 1 ] ||
    { cat "$WORK/tune_bad.txt"; fail "corrupt history: not one message naming line 3"; }
cmp -s "$WORK/bad.jsonl" "$WORK/bad.keep" && cmp -s "$WORK/t.json" "$WORK/t.keep" ||
    fail "corrupt history: a file was changed"
# a history or an --out that cannot be written: refused before measuring,
# the other file unchanged
if tune --profile "$WORK/t.json" --history "$WORK/nodir/h.jsonl" > "$WORK/tune_bad.txt" 2>&1; then
    fail "bench tune with an unwritable history succeeded"; fi
[ "$(grep -c "error: cannot write $WORK/nodir/h.jsonl: No such file" "$WORK/tune_bad.txt")" = 1 ] &&
    ! grep -q "^#collective" "$WORK/tune_bad.txt" ||
    { cat "$WORK/tune_bad.txt"; fail "unwritable history: not one message before measuring"; }
cp "$WORK/h.jsonl" "$WORK/h.keep"
if tune --profile "$WORK/t.json" --out "$WORK/nodir/t.json" --history "$WORK/h.jsonl" \
    > "$WORK/tune_bad.txt" 2>&1; then fail "bench tune with an unwritable --out succeeded"; fi
[ "$(grep -c "error: cannot write $WORK/nodir/t.json" "$WORK/tune_bad.txt")" = 1 ] ||
    { cat "$WORK/tune_bad.txt"; fail "unwritable --out: not one message"; }
cmp -s "$WORK/h.jsonl" "$WORK/h.keep" && cmp -s "$WORK/t.json" "$WORK/t.keep" ||
    fail "unwritable --out: a file was changed"
echo "ok   bench tune: no --profile, a missing one, FF_ALGO set, --repeats 0, a corrupt history, an unwritable history or --out: one message, exit non-zero, no file changed"

# a second regime in the profile reaches the model: small messages priced at
# 1 s each make a 2-step ring all-reduce of 4 KiB cost 2 s in the pred
# column (nodes of one rank: every step between nodes)
python3 - "$WORK/p1.json" "$WORK/regime.json" "$WORK/regime_bad.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p.update(small_max_inter_B=1e9, alpha_inter_small_s=1.0, beta_inter_small_Bps=1e12)
json.dump(p, open(sys.argv[2], "w"))
p["beta_inter_small_Bps"] = 0
json.dump(p, open(sys.argv[3], "w"))
PY
FF_RANKS_PER_NODE=1 FF_PROFILE="$WORK/regime.json" "$MPIEXEC" -np 2 "$FF" bench coll --colls ar \
    --algos ring -b 4K -e 4K -n 1 -w 0 --place out > "$WORK/regime.txt" 2>&1 ||
    { cat "$WORK/regime.txt"; fail "FF_PROFILE with two regimes"; }
pred=$(awk '$5 == "ring" { print $6 }' "$WORK/regime.txt")
awk -v p="$pred" 'BEGIN { exit !(p > 1.99e6 && p < 2.01e6) }' ||
    { cat "$WORK/regime.txt"; fail "two-regime profile: predicted $pred us, expected 2e6"; }
if FF_PROFILE="$WORK/regime_bad.json" "$MPIEXEC" -np 2 "$FF" bench coll --colls ar -b 4K -e 4K \
    -n 1 > "$WORK/regime_bad.txt" 2>&1; then fail "a zero small-message beta was accepted"; fi
grep -q "FF_PROFILE: .*small" "$WORK/regime_bad.txt" || { cat "$WORK/regime_bad.txt"; fail "message"; }
echo "ok   a profile's second regime is read (ring all-reduce of 4 KiB predicted $pred us, 2e6 expected); a zero small beta refused"

# the all-to-all's rounds (FF_A2A_WINDOW partners at once, 8 by default):
# with the same 1 s per small message, 4 nodes of one rank (3 partners)
# take one round by default, two with a window of 2, three with 1
for w in "" 2 1; do
    FF_A2A_WINDOW=$w FF_RANKS_PER_NODE=1 FF_PROFILE="$WORK/regime.json" "$MPIEXEC" -np 4 "$FF" \
        bench coll --colls a2a --algos ring -b 4K -e 4K -n 1 -w 0 > "$WORK/a2a$w.txt" 2>&1 ||
        { cat "$WORK/a2a$w.txt"; fail "all-to-all with FF_A2A_WINDOW=$w"; }
    grep -q "^# total #wrong: 0$" "$WORK/a2a$w.txt" || fail "all-to-all window $w: #wrong"
    pred=$(awk '!/^#/ && $5 == "ring" { print $6 }' "$WORK/a2a$w.txt")
    want=$(case "$w" in "") echo 1e6 ;; 2) echo 2e6 ;; 1) echo 3e6 ;; esac)
    awk -v p="$pred" -v q="$want" 'BEGIN { exit !(p > 0.99 * q && p < 1.01 * q) }' ||
        { cat "$WORK/a2a$w.txt"; fail "all-to-all window '$w': predicted $pred us, expected $want"; }
done
if FF_A2A_WINDOW=9 "$MPIEXEC" -np 2 "$FF" bench coll --colls a2a -b 4K -e 4K -n 1 \
    > "$WORK/a2a_bad.txt" 2>&1; then fail "FF_A2A_WINDOW=9 was accepted"; fi
grep -q "FF_A2A_WINDOW=9: expected an integer from 1 to 8" "$WORK/a2a_bad.txt" ||
    { cat "$WORK/a2a_bad.txt"; fail "message"; }
echo "ok   all-to-all rounds follow FF_A2A_WINDOW (1, 2, 3 rounds predicted, #wrong 0); 9 refused"
if FF_STRICT_VOLUME=2 "$MPIEXEC" -np 2 "$FF" bench coll --colls ar -b 4K -e 4K -n 1 \
    > "$WORK/sv_bad.txt" 2>&1; then fail "FF_STRICT_VOLUME=2 was accepted"; fi
grep -q "FF_STRICT_VOLUME=2: expected 0 or 1" "$WORK/sv_bad.txt" ||
    { cat "$WORK/sv_bad.txt"; fail "message"; }
echo "ok   FF_STRICT_VOLUME=2 refused"

# the planner's strict reader, where this build has the planner
if "$FF" --help 2>&1 | grep -q "^  plan "; then
    "$FF" plan --machine "$WORK/p2.json" --print-machine > "$WORK/plan.txt" 2>&1 ||
        { cat "$WORK/plan.txt"; fail "fourfold plan refused the profile"; }
    echo "ok   fourfold plan --machine reads the profile"
fi

"$MPIEXEC" -np 2 "$FF" bench gemm --shapes 64,32x48x16 --threads 1 --seconds 0 \
    > "$WORK/gemm.txt" 2>&1 || { cat "$WORK/gemm.txt"; fail "bench gemm"; }
grep -q "^# OpenBLAS kernels: .* (" "$WORK/gemm.txt" && grep -q "32x48x16" "$WORK/gemm.txt" ||
    { cat "$WORK/gemm.txt"; fail "bench gemm output"; }
echo "ok   bench gemm"
# oneDNN's bf16 products, where the build has oneDNN (its kernels named at the end)
if "$MPIEXEC" -np 2 "$FF" bench gemm --shapes 32x48x16 --threads 1 --seconds 0 --products bf16 \
    > "$WORK/gemm16.txt" 2>&1; then
    grep -q "^# products: bf16 on oneDNN" "$WORK/gemm16.txt" && grep -q "32x48x16" "$WORK/gemm16.txt" &&
        grep -q "^# oneDNN's kernels: [a-z]" "$WORK/gemm16.txt" ||
        { cat "$WORK/gemm16.txt"; fail "bench gemm --products bf16 output"; }
    echo "ok   bench gemm --products bf16"
else
    grep -q "this build has no oneDNN" "$WORK/gemm16.txt" ||
        { cat "$WORK/gemm16.txt"; fail "bench gemm --products bf16"; }
    echo "ok   bench gemm --products bf16 refused: a build without oneDNN"
fi
echo "bench: passed"
