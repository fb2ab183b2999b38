"""scripts/gpu/sanitize.sh's Python side: which conformance cases each sanitizer runs, one shard of them, the summary.

  python3 scripts/gpu/sanitize.py select BACKEND DIR     the case lists of BACKEND (natively: plans, and one run of
                                                         the representative cases, which fills the kernel cache)
  python3 scripts/gpu/sanitize.py run BACKEND LIST KEY I/N RESULTS   shard I of N of the list KEY, one JSON line a case
  python3 scripts/gpu/sanitize.py summary DIR            the table of DIR's logs and results (also DIR/summary.md)

Note [sanitized grid]: compute-sanitizer slows a process 10-100x, so the tools get different lists. memcheck runs the
whole conformance grid in MEMCHECK_DTYPES (float32: with torch's default TF32 setting, the tensor-core tiles for dense
problems, the FMA kernels for the rest). racecheck and initcheck run the representative subset: per dtype of
SUBSET_DTYPES, the first case of every distinct plan (the kernels, their modules and defines of each result, for the
layouts the problem implies): every kernel variant the grid's plans name, though a case's own operand layouts may
load other variants at run time. Each case runs once (no warm-up call; the conformance check is the same). The
summary names every kernel covered and summary.md every case.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import sys
import time

MEMCHECK_DTYPES = os.environ.get("MEMCHECK_DTYPES", "float32").split(",")
SUBSET_DTYPES = os.environ.get("SUBSET_DTYPES", "float32,float64,float16").split(",")


def _cases():
    from portconv.conformance import cases

    return {c.id: c for c in cases.all_cases()}


def _kernels(plan) -> list[str]:
    return sorted({x.kernel for k in plan.kernels for x in k.launches})


def select(backend: str, out: pathlib.Path) -> None:
    """Write out/select-BACKEND.json: the memcheck list (every case), the subset (a case per distinct plan), each
    case's kernels; the subset runs natively once (its verdicts are the baseline, its modules fill the cache)."""
    from portconv import backends
    from portconv.conformance.reference import make_inputs, output_shape
    from portconv.conformance.runner import default_device, plan_for, run_case
    from portconv.errors import BackendUnavailable, Unsupported

    avail = backends.get(backend).probe()
    if not avail:
        sys.exit(f"backend '{backend}' is unavailable: {avail.reason}")
    device, cases = default_device(backend), _cases()
    kernels, subset, seen, unsupported = {}, [], set(), collections.Counter()
    for dtype in sorted(set(MEMCHECK_DTYPES) | set(SUBSET_DTYPES)):
        for cid, case in cases.items():
            try:
                plan = plan_for(case, make_inputs(case, dtype, device, output_shape(case)), backend)
            except (BackendUnavailable, Unsupported):
                unsupported[dtype] += 1
                continue
            kernels[f"{cid}|{dtype}"] = _kernels(plan)
            signature = (dtype, tuple((k.result, tuple((x.module, x.kernel) for x in k.launches))
                                      for k in plan.kernels))
            if dtype in SUBSET_DTYPES and signature not in seen:
                seen.add(signature)
                subset.append([cid, dtype])
    memcheck = [[cid, d] for d in MEMCHECK_DTYPES for cid in cases if f"{cid}|{d}" in kernels]
    native = {f"{cid}|{d}": run_case(cases[cid], backend, d, warm=False).status for cid, d in subset}
    (out / f"select-{backend}.json").write_text(json.dumps(
        {"memcheck": memcheck, "subset": subset, "kernels": kernels, "native": native,
         "unsupported": dict(unsupported)}, indent=0))
    print(f"{backend}: memcheck {len(memcheck)} cases ({','.join(MEMCHECK_DTYPES)}), subset {len(subset)} cases "
          f"({','.join(SUBSET_DTYPES)}), natively {collections.Counter(native.values())}, unsupported "
          f"{dict(unsupported)}")


def run(backend: str, listing: pathlib.Path, key: str, shard: str, results: pathlib.Path) -> None:
    """Shard I/N of the list ``key``: one JSON line a case, written as it finishes (a timeout keeps what ran)."""
    from portconv.conformance.runner import run_case

    i, n = map(int, shard.split("/"))
    cases, sel = _cases(), json.loads(listing.read_text())
    with results.open("w") as f:
        for cid, dtype in sel[key][i::n]:
            t0 = time.perf_counter()
            r = run_case(cases[cid], backend, dtype, warm=False)
            f.write(json.dumps({"id": cid, "dtype": dtype, "status": r.status, "errors": r.errors()[:2],
                                "seconds": round(time.perf_counter() - t0, 2),
                                "kernels": sel["kernels"][f"{cid}|{dtype}"]}) + "\n")
            f.flush()


# compute-sanitizer's report: a record starts with "========= <text>" (continuation lines are indented further); its
# kernel is the first portconv_ name in it, else the first "at <kernel>" or "at 0x... in [void ]<kernel>" (None: '?');
# the summary lines give the counts.
_NOT_RECORDS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")
_OWN = re.compile(r"\b(portconv_\w+)")
_KERNEL = re.compile(r"\bat (?:0x[0-9a-f]+ in )?(?:void )?([A-Za-z_][\w:]*)")
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error")
_HAZARDS = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def parse_log(text: str) -> dict:
    """{'errors': the summary's count (None without a summary: the run did not finish), 'hazards': racecheck's
    warnings, 'by_kernel': records per kernel}."""
    by_kernel: collections.Counter = collections.Counter()
    records: list[list[str]] = []
    for line in text.splitlines():
        body = line[len("========= "):] if line.startswith("========= ") else ""
        if body.strip() and not body.startswith(" "):
            records.append([] if body.startswith(_NOT_RECORDS) else [body])
        elif records and records[-1] and body.strip():
            records[-1].append(body)
    for rec in filter(None, records):
        text_of = "\n".join(rec)
        m = _OWN.search(text_of) or _KERNEL.search(text_of)
        by_kernel[m.group(1) if m else "?"] += 1
    errors = [int(m.group(1)) for m in _ERRORS.finditer(text)]
    hazards = [(int(m.group(2)), int(m.group(3))) for m in _HAZARDS.finditer(text)]
    if hazards:
        return {"errors": sum(e for e, _ in hazards), "hazards": sum(w for _, w in hazards), "by_kernel": by_kernel}
    return {"errors": sum(errors) if errors else None, "hazards": 0, "by_kernel": by_kernel}


def summary(folder: pathlib.Path) -> int:
    """A row per tool and backend, after what each covered: printed (the case ids counted), and in folder/summary.md
    (the case ids listed); exit status 1 unless every run finished clean and every case passed."""
    rows, detail, listed, ok = [], [], [], True
    status = {p.stem: p.read_text().split() for p in folder.glob("*.rc")}  # tool-backend-i -> [rc, seconds]
    for tool, backend in sorted({tuple(p.stem.split("-")[:2]) for p in folder.glob("*.log")}):
        shards = sorted(folder.glob(f"{tool}-{backend}-*.log"))
        sel = json.loads((folder / f"select-{backend}.json").read_text())
        wanted = sel["memcheck" if tool == "memcheck" else "subset"]
        done = [json.loads(line) for p in folder.glob(f"{tool}-{backend}-*.jsonl") for line in p.read_text().split(
            "\n") if line]
        logs = [parse_log(p.read_text(errors="replace")) for p in shards]
        unfinished = [p.stem for p, lg in zip(shards, logs) if lg["errors"] is None]
        errors = sum(lg["errors"] or 0 for lg in logs)
        kern = sum((lg["by_kernel"] for lg in logs), collections.Counter())
        own = sum(v for k, v in kern.items() if k.startswith("portconv_"))  # records in portconv's kernels
        unknown = kern.get("?", 0) + max(0, errors - sum(kern.values()))  # records without a kernel, or unparsed
        failed = [f"{r['id']} {r['dtype']}: {(r['errors'] or ['?'])[0][:160]}" for r in done if r["status"] == "fail"]
        rcs = sorted({status.get(p.stem, ["?"])[0] for p in shards})
        complete = not unfinished and not failed and len(done) == len(wanted)
        verdict = ("clean" if complete and not errors and not kern else
                   "clean in portconv_ kernels" if complete and not own and not unknown else "NOT CLEAN")
        ok &= verdict != "NOT CLEAN"
        dtypes = ",".join(sorted({d for _, d in wanted}))
        rows.append(f"| {tool} | {backend} | {dtypes} | {len(done)}/{len(wanted)} | "
                    f"{sum(r['status'] == 'pass' for r in done)} | {len(failed)} | {errors} | {own} | {verdict} | "
                    f"{' '.join(rcs)} |")
        covered = sorted({k for r in done for k in r["kernels"]})
        lines = [f"### {tool} {backend}: {len(done)} of {len(wanted)} cases ({dtypes}, selection: "
                 f"{'the whole grid' if tool == 'memcheck' else 'a case per distinct plan'})",
                 f"kernels covered ({len(covered)}): {', '.join(covered)}",
                 *(f"unfinished (timeout or crash, no sanitizer summary): {s}" for s in unfinished),
                 *([f"reports by kernel: {dict(kern)}"] if kern else []),
                 *(f"FAILED {f}" for f in failed[:20])]
        detail += [*lines, ""]
        listed += [*lines, "cases run: " + ", ".join(f"{r['id']}[{r['dtype']}]" for r in done), ""]
    head = ["| tool | backend | dtypes | cases run | pass | fail | sanitizer errors | in portconv_ kernels | verdict "
            "| exit codes |", "|---|---|---|---|---|---|---|---|---|---|"]
    text = "\n".join(["# compute-sanitizer over the conformance grid (Note [sanitized grid])", "", *listed, *head,
                      *rows]) + "\n"
    (folder / "summary.md").write_text(text)
    print("\n".join(detail) + "\n" + "\n".join(head + rows))
    return 0 if ok and rows else 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "select":
        select(args[0], pathlib.Path(args[1]))
    elif cmd == "run":
        run(args[0], pathlib.Path(args[1]), args[2], args[3], pathlib.Path(args[4]))
    elif cmd == "summary":
        sys.exit(summary(pathlib.Path(args[0])))
    else:
        sys.exit(f"unknown command {cmd!r}: select, run or summary")
